// Live parts: every element with data-live is replaced by a fresh copy of itself, fetched from
// its own page twice a second, when it changed (not while the reader selects text). Signed out
// meanwhile: back to the sign-in page; any other failure: tried again at the next poll.
"use strict";
for (const part of document.querySelectorAll("[data-live]")) {
  let busy = false;
  setInterval(async () => {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const answer = await fetch(part.dataset.live, { credentials: "same-origin", cache: "no-store" });
      if (answer.status === 401) {
        location.assign("/ui/signin?next=" + encodeURIComponent(location.pathname + location.search));
      } else if (answer.ok) {
        const html = await answer.text();
        const selecting = String(window.getSelection() || "") !== "";
        if (html !== part.dataset.shown && !selecting) {
          // Scrolled boxes (a job's output) keep where the reader was.
          const scrolled = [...part.querySelectorAll("pre")].map((box) => box.scrollTop);
          part.innerHTML = html;
          part.dataset.shown = html;
          part.querySelectorAll("pre").forEach((box, i) => { box.scrollTop = scrolled[i] ?? box.scrollHeight; });
        }
      }
    } catch (_) {
      // The service is restarting: the next poll tries again.
    } finally {
      busy = false;
    }
  }, 500);
}
