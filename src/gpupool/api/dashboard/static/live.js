// Live parts: every element with data-live is replaced by a fresh copy of itself, fetched from
// its own page twice a second, when it changed. Signed out meanwhile: back to the sign-in page.
"use strict";
for (const part of document.querySelectorAll("[data-live]")) {
  let busy = false;
  setInterval(async () => {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const answer = await fetch(part.dataset.live, { credentials: "same-origin", cache: "no-store" });
      if (answer.status === 401) {
        location.assign("/ui/signin?next=" + encodeURIComponent(location.pathname));
      } else if (answer.ok) {
        const html = await answer.text();
        if (html !== part.dataset.shown) {
          part.innerHTML = html;
          part.dataset.shown = html;
        }
      }
    } catch (_) {
      // The service is restarting: the next poll tries again.
    } finally {
      busy = false;
    }
  }, 500);
}
