// Token panes of the run page: pages of tokens are fetched as the reader scrolls (a 32k-token
// sample opens as fast as a short one), coloured by kind, sampled tokens by their probability.
"use strict";
(function () {
  const KINDS = ["prompt", "sampled", "tool", "template"];
  const panes = new Map();  // segment -> state

  function esc(s) {
    return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function heat(lp) {
    // p = 1 -> green (hue 120), p = 0 -> red (hue 0).
    return "hsl(" + Math.round(120 * Math.exp(lp)) + ",75%,82%)";
  }

  function render(st, page) {
    const out = [];
    for (let j = 0; j < page.text.length; j++) {
      const i = page.start + j;
      const mark = st.turns.get(i);
      if (mark !== undefined) out.push('<span class="turn-mark">turn ' + esc(mark) + "</span>");
      const k = page.kind[j];
      const style = k === 1 && page.lp[j] !== null ? ' style="background:' + heat(page.lp[j]) + '"' : "";
      out.push('<span class="tok k' + k + '" data-i="' + i + '"' + style + ">" + esc(page.text[j]) + "</span>");
      st.kind[i] = k;
      st.lp[i] = page.lp[j];
    }
    st.pane.insertAdjacentHTML("beforeend", out.join(""));
  }

  async function loadNext(st) {
    if (st.loading || st.next >= st.total) return;
    st.loading = true;
    try {
      const url = "/ui/api/samples/" + st.cursor + "/tokens?start=" + st.next + "&count=" + st.pageSize;
      const resp = await fetch(url, { credentials: "same-origin" });
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      const page = await resp.json();
      render(st, page);
      st.next = page.start + page.text.length;
      st.pane.dataset.loaded = String(st.next);
    } catch (err) {
      st.pane.insertAdjacentHTML("beforeend", '<div class="error">could not load tokens: ' + esc(String(err)) + "</div>");
      st.next = st.total;  // stop asking
    } finally {
      st.loading = false;
    }
    if (st.next > st.pageSize || visible(st.pane)) {
      if (visible(st.sentinel)) loadNext(st);
    }
  }

  function visible(el) {
    const r = el.getBoundingClientRect();
    return r.top < window.innerHeight + 600;
  }

  async function jumpTo(seg, pos) {
    const st = panes.get(seg);
    while (st.next <= pos && st.next < st.total) {
      if (st.loading) await new Promise((r) => setTimeout(r, 20));
      else await loadNext(st);
    }
    const el = st.pane.querySelector('[data-i="' + pos + '"]');
    if (el) el.scrollIntoView({ block: "center" });
  }

  const observer = new IntersectionObserver((entries) => {
    for (const e of entries) if (e.isIntersecting) loadNext(panes.get(e.target.dataset.seg));
  }, { rootMargin: "600px" });

  document.querySelectorAll(".tokens").forEach((pane) => {
    const turns = new Map();
    for (const t of (pane.dataset.turns || "").split(",").filter(Boolean)) {
      const [start, index, finish] = t.split(":");
      turns.set(Number(start), index + (finish ? " · " + finish : ""));
    }
    const st = {
      pane, turns, cursor: pane.dataset.cursor, total: Number(pane.dataset.total),
      pageSize: Number(pane.dataset.page), next: 0, loading: false, kind: [], lp: [],
      sentinel: pane.nextElementSibling,
    };
    panes.set(pane.dataset.seg, st);
    pane.dataset.loaded = "0";
    loadNext(st);  // the first page at once, wherever the pane is; the rest as it scrolls into view
    observer.observe(st.sentinel);
    pane.addEventListener("mouseover", (ev) => {
      const i = ev.target.dataset && ev.target.dataset.i;
      const info = document.getElementById("tokinfo");
      if (i === undefined) { info.hidden = true; return; }
      const lp = st.lp[i];
      info.textContent = "token " + i + " · " + KINDS[st.kind[i]] +
        (lp !== null && lp !== undefined ? " · logprob " + lp.toFixed(3) + " · p " + Math.exp(lp).toFixed(3) : "");
      info.hidden = false;
    });
  });

  document.querySelectorAll("a.jump").forEach((a) => a.addEventListener("click", (ev) => {
    ev.preventDefault();
    jumpTo(a.dataset.seg, Number(a.dataset.pos));
  }));

  const heatBox = document.getElementById("heat");
  if (heatBox) heatBox.addEventListener("change", () => {
    document.querySelectorAll(".tokens").forEach((p) => p.classList.toggle("noheat", !heatBox.checked));
  });
})();
