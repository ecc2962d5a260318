// Outbox Bridge console: the few behaviours plain HTML lacks. No inline
// handlers anywhere (the Content-Security-Policy allows none): everything is
// wired here by data attributes.
(function () {
  "use strict";
  function ready(fn) {
    if (document.readyState !== "loading") fn(); else document.addEventListener("DOMContentLoaded", fn);
  }
  ready(function () {
    // Copy buttons: data-copy="<id of the element whose text to copy>".
    document.querySelectorAll("[data-copy]").forEach(function (btn) {
      btn.addEventListener("click", function () {
        var el = document.getElementById(btn.getAttribute("data-copy"));
        if (!el) return;
        var text = el.textContent;
        var done = function () {
          var note = btn.parentNode.querySelector("[data-copied]");
          if (note) note.hidden = false;
          btn.textContent = "Copied";
        };
        if (navigator.clipboard && window.isSecureContext) {
          navigator.clipboard.writeText(text).then(done, function () { fallback(el); done(); });
        } else { fallback(el); done(); }
      });
    });
    function fallback(el) {
      var range = document.createRange();
      range.selectNodeContents(el);
      var sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      try { document.execCommand("copy"); } catch (e) { /* the text stays selected for Ctrl-C */ }
    }
    // Select-all checkboxes: data-select-all="<name of the row checkboxes>".
    document.querySelectorAll("[data-select-all]").forEach(function (box) {
      box.addEventListener("change", function () {
        var form = box.closest("form") || document;
        form.querySelectorAll('input[type=checkbox][name="' + box.getAttribute("data-select-all") + '"]').forEach(function (c) {
          c.checked = box.checked;
        });
      });
    });
    document.querySelectorAll("[data-back]").forEach(function (a) {
      a.addEventListener("click", function (e) { e.preventDefault(); history.back(); });
      a.setAttribute("href", "/ui/");
    });
  });
})();
