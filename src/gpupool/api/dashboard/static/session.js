// gpupool's banner on a notebook session's pages: what the session was warned of (it is idle
// and will be reclaimed), read from the status the service keeps for it, every 15 s.
(function () {
  const script = document.currentScript;
  const status = script && script.dataset.status;
  if (!status) return;
  let banner = null;
  function show(text) {
    if (!text) {
      if (banner) banner.remove();
      banner = null;
      return;
    }
    if (!banner) {
      banner = document.createElement("div");
      banner.id = "gpupool-banner";
      banner.setAttribute("role", "alert");
      banner.style.cssText =
        "position:fixed;top:0;left:0;right:0;z-index:100000;padding:6px 12px;" +
        "background:#fff3cd;color:#533f03;border-bottom:1px solid #e0c36c;font:14px sans-serif";
      document.body.appendChild(banner);
    }
    banner.textContent = "gpupool: " + text;
  }
  async function look() {
    try {
      const answer = await fetch(status, { credentials: "same-origin" });
      if (answer.ok) show((await answer.json()).warning);
    } catch (_) {
      // the service restarts, or the session has ended: nothing to show
    }
  }
  look();
  setInterval(look, 15000);
})();
