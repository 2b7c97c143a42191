/* A stand-in for NVIDIA's libnvidia-ml.so.1, for tests on machines without a GPU.
 *
 * The real nvidia-ml-py (pynvml) loads it by its soname (put its directory on LD_LIBRARY_PATH)
 * and calls exactly the functions below, which tunehub's code path uses. Its figures come from
 * the file named by NVML_STANDIN_FIGURES, read again on every call, so a test changes them live.
 * One device per line starting with "gpu", then key=value words:
 *
 *   gpu util=85 mem_used=1048576 mem_total=17179869184 pids=123,456 error=0 name=X uuid=GPU-1
 *
 * error=N makes every call about that device return N (15: NVML_ERROR_GPU_IS_LOST). A line
 * "init_error=N" makes nvmlInit fail with N (9: NVML_ERROR_DRIVER_NOT_LOADED). No file, or no
 * variable: no devices.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 16
#define MAX_PIDS 32

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

struct device {
    unsigned int util;
    unsigned long long mem_used, mem_total;
    unsigned int pids[MAX_PIDS];
    unsigned int npids;
    int error;
    char name[64];
    char uuid[80];
};
typedef struct device *nvmlDevice_t;

/* Handles point into this table; the figures behind them are refreshed by every call. */
static struct device devices[MAX_DEVICES];
static unsigned int ndevices;
static int init_error;
static int initialised;

static void parse_word(struct device *d, char *word) {
    char *value = strchr(word, '=');
    if (value == NULL)
        return;
    *value++ = '\0';
    if (strcmp(word, "util") == 0) {
        d->util = (unsigned int)strtoul(value, NULL, 10);
    } else if (strcmp(word, "mem_used") == 0) {
        d->mem_used = strtoull(value, NULL, 10);
    } else if (strcmp(word, "mem_total") == 0) {
        d->mem_total = strtoull(value, NULL, 10);
    } else if (strcmp(word, "error") == 0) {
        d->error = (int)strtol(value, NULL, 10);
    } else if (strcmp(word, "name") == 0) {
        snprintf(d->name, sizeof d->name, "%s", value);
    } else if (strcmp(word, "uuid") == 0) {
        snprintf(d->uuid, sizeof d->uuid, "%s", value);
    } else if (strcmp(word, "pids") == 0) {
        char *save = NULL;
        for (char *p = strtok_r(value, ",", &save); p && d->npids < MAX_PIDS;
             p = strtok_r(NULL, ",", &save))
            d->pids[d->npids++] = (unsigned int)strtoul(p, NULL, 10);
    }
}

static void reload(void) {
    ndevices = 0;
    init_error = 0;
    const char *path = getenv("NVML_STANDIN_FIGURES");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (f == NULL)
        return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *save = NULL;
        char *word = strtok_r(line, " \t\r\n", &save);
        if (word == NULL)
            continue;
        if (strncmp(word, "init_error=", 11) == 0) {
            init_error = (int)strtol(word + 11, NULL, 10);
            continue;
        }
        if (strcmp(word, "gpu") != 0 || ndevices >= MAX_DEVICES)
            continue;
        struct device *d = &devices[ndevices];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "Stand-in GPU");
        snprintf(d->uuid, sizeof d->uuid, "GPU-standin-%u", ndevices);
        while ((word = strtok_r(NULL, " \t\r\n", &save)) != NULL)
            parse_word(d, word);
        ndevices++;
    }
    fclose(f);
}

/* The device behind a handle with fresh figures, or the error a call about it returns. */
static nvmlReturn_t device(nvmlDevice_t handle, struct device **out) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    reload();
    long index = handle - devices;
    if (handle == NULL || index < 0 || index >= (long)ndevices)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = &devices[index];
    return devices[index].error;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    reload();
    if (init_error)
        return init_error;
    initialised = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    reload();
    *count = ndevices;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *handle) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    reload();
    if (handle == NULL || index >= ndevices)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (devices[index].error)
        return devices[index].error;
    *handle = &devices[index];
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length) {
    if (out == NULL || strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t handle, char *name, unsigned int length) {
    struct device *d;
    nvmlReturn_t ret = device(handle, &d);
    return ret ? ret : copy_text(d->name, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t handle, char *uuid, unsigned int length) {
    struct device *d;
    nvmlReturn_t ret = device(handle, &d);
    return ret ? ret : copy_text(d->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t handle, nvmlUtilization_t *util) {
    struct device *d;
    nvmlReturn_t ret = device(handle, &d);
    if (ret)
        return ret;
    if (util == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    util->gpu = d->util;
    util->memory = d->mem_total ? (unsigned int)(100 * d->mem_used / d->mem_total) : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t handle, nvmlMemory_t *memory) {
    struct device *d;
    nvmlReturn_t ret = device(handle, &d);
    if (ret)
        return ret;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = d->mem_total;
    memory->used = d->mem_used;
    memory->free = d->mem_total > d->mem_used ? d->mem_total - d->mem_used : 0;
    return NVML_SUCCESS;
}

/* As NVML does: with too small an array, the count needed and INSUFFICIENT_SIZE (pynvml asks
 * first with none, then with room for more). */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t handle, unsigned int *count,
                                                      nvmlProcessInfo_t *infos) {
    struct device *d;
    nvmlReturn_t ret = device(handle, &d);
    if (ret)
        return ret;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (*count < d->npids || (infos == NULL && d->npids > 0)) {
        *count = d->npids;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = d->npids;
    for (unsigned int i = 0; i < d->npids; i++) {
        infos[i].pid = d->pids[i];
        infos[i].usedGpuMemory = d->npids ? d->mem_used / d->npids : 0;
        infos[i].gpuInstanceId = 0xFFFFFFFF;
        infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    return NVML_SUCCESS;
}
