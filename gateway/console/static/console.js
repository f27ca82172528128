// Expiry countdowns: seconds left as rendered by the server, counted down locally.
(function () {
  const started = Date.now();
  function format(s) {
    if (s <= 0) return "expired";
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    return "in " + (h ? h + "h " : "") + (h || m ? m + "m " : "") + sec + "s";
  }
  function tick() {
    const elapsed = Math.floor((Date.now() - started) / 1000);
    document.querySelectorAll("time.countdown").forEach(function (el) {
      const left = parseInt(el.dataset.secondsLeft, 10) - elapsed;
      el.textContent = format(left);
      el.classList.toggle("overdue", left <= 0);
    });
  }
  document.addEventListener("DOMContentLoaded", function () { tick(); setInterval(tick, 1000); });
})();
