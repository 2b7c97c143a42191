# TEST DEVICE ONLY - stands in for tensorflow/tensorflow:2.21.0-gpu where no registry can be
# reached. Context: a directory holding bookworm-rootfs.tar (made by images/standin/bases.sh).
# The shim: TensorFlow pip-installed into the system python3 (the CPU build: no CUDA here) and a
# uid-1000 user named `ubuntu`, as the Ubuntu-based official image has.
FROM scratch
ADD bookworm-rootfs.tar /
ARG TENSORFLOW_VERSION=2.21.0
RUN --mount=type=cache,target=/root/.cache/pip \
    python3 -m pip install --break-system-packages --root-user-action=ignore \
      "tensorflow-cpu==${TENSORFLOW_VERSION}" \
 && useradd --uid 1000 --user-group --create-home --shell /bin/bash ubuntu
ENV LANG=C.UTF-8
CMD ["bash"]
