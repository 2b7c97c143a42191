/*
 * tunehub: the idle-GPU warning inside JupyterLab.
 *
 * Why a plugin: the person must see, in the page they work in, that their server's GPUs are
 * unused and will be given back (issue #26). The server extension hub.singleuser.gpu_reclaim
 * keeps the server's reclaim state; this plugin polls it (GET <base>/tunehub/gpu-reclaim) and
 * raises a JupyterLab warning notification (the apputils:notify command, so no JupyterLab
 * package is bundled: the built extension stays a few kilobytes) while the server is warned,
 * and dismisses it once the GPUs are used again.
 */

const NOTIFY = 'apputils:notify';
const DISMISS = 'apputils:dismiss-notification';
const WARNED = ['warn', 'warned', 'cell running', 'reclaim'];
// Why a back-off: once the server stops (culled, its GPUs given back, the hub down) every poll
// fails; polling on at the server's period would fill the console with the same warning and
// knock on a dead server forever. Each failure doubles the wait up to MAX_DELAY; a success
// brings the server's period back.
const MAX_DELAY = 5 * 60 * 1000;

// Authenticated as JupyterLab's own requests are (ServerConnection.makeRequest): the server's
// token if the page has one, and the XSRF cookie echoed in a header (JupyterHub's servers treat
// a cookie-only fetch without it as anonymous).
function headers(settings) {
  const h = { Accept: 'application/json' };
  const xsrf = document.cookie.match('\\b_xsrf=([^;]*)\\b');
  if (xsrf) {
    h['X-XSRFToken'] = decodeURIComponent(xsrf[1]);
  }
  if (settings.token) {
    h['Authorization'] = `token ${settings.token}`;
  }
  return h;
}

async function status(settings) {
  const response = await fetch(`${settings.baseUrl}tunehub/gpu-reclaim`, {
    credentials: 'same-origin',
    headers: headers(settings)
  });
  if (!response.ok) {
    throw new Error(`tunehub/gpu-reclaim: HTTP ${response.status}`);
  }
  return response.json();
}

const plugin = {
  id: 'tunehub-gpu-notice:plugin',
  description: 'Warns that this server\'s unused GPUs are about to be given back.',
  autoStart: true,
  activate: app => {
    const settings = app.serviceManager.serverSettings;
    let shown = null; // the notification's id and message, while one is up
    let delay = 10000;
    let failures = 0; // failed polls in a row

    async function poll() {
      try {
        const s = await status(settings);
        failures = 0;
        delay = Math.max(1000, (s.poll_seconds || 10) * 1000);
        if (Array.isArray(s.gpus) && s.gpus.length === 0) {
          return; // a CPU server: nothing to measure, stop asking
        }
        const warned = WARNED.includes(s.state) && s.message;
        if (warned && (!shown || shown.message !== s.message)) {
          if (shown) {
            await app.commands.execute(DISMISS, { id: shown.id });
          }
          const id = await app.commands.execute(NOTIFY, {
            message: s.message,
            type: 'warning',
            options: { autoClose: false }
          });
          shown = { id, message: s.message };
        } else if (!warned && shown) {
          await app.commands.execute(DISMISS, { id: shown.id });
          shown = null;
        }
      } catch (err) {
        failures += 1;
        delay = Math.min(MAX_DELAY, delay * 2);
        if (failures === 1) {
          console.warn('tunehub: GPU reclaim status not read; asking again less often', err);
        }
      }
      setTimeout(poll, delay);
    }

    // After every plugin started: the notification commands are registered by then.
    app.restored.then(poll);
  }
};

module.exports = plugin;
