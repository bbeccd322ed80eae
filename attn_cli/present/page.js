"use strict";
// attn's trace page: navigation, language, theme, batch/head filters and the derivation panel.
// Every text comes from the page's data (made in Python); this script computes nothing and
// writes text only through textContent, so token text is never parsed as HTML.
(function () {
  var t0 = performance.now();
  var data = JSON.parse(document.getElementById("attn-data").textContent);
  var body = document.body;
  var sections = Array.prototype.slice.call(document.querySelectorAll("section.stage"));
  var navButtons = Array.prototype.slice.call(document.querySelectorAll("nav.stages button"));
  var title = document.querySelector('[data-role="stage-title"]');
  var panel = document.querySelector('[data-role="derivation"]');
  var current = 0;
  var pinned = null;
  var large = false;  // the projector's larger type (the L key, the A+ button, #large)

  function words(key) { return data.words[body.dataset.lang][key]; }

  // the URL's hash: the stage in view and the larger type, "#stage-3,large"; written only when
  // the reader moves (written while the page loads, the browser would scroll to that section)
  function remember() {
    var hash = "#" + sections[current].id + (large ? ",large" : "");
    if (location.hash !== hash && history.replaceState) {
      try { history.replaceState(null, "", hash); } catch (e) { /* srcdoc */ }
    }
  }

  function named(section) {  // a section's name in the language shown (a stage's is math)
    var zh = section.dataset.nameZh;
    return zh && body.dataset.lang === "zh" ? zh : section.dataset.stageName;
  }

  function show(k, quietly) {
    if (!sections.length) { return; }
    current = Math.max(0, Math.min(sections.length - 1, k));
    sections.forEach(function (s, i) { s.classList.toggle("current", i === current); });
    navButtons.forEach(function (b, i) { b.setAttribute("aria-current", i === current ? "true" : "false"); });
    title.textContent = named(sections[current]);
    title.dataset.stage = sections[current].dataset.stageName;
    if (!quietly) { remember(); }
  }

  function setLarge(on) {
    large = on;
    body.dataset.large = on ? "1" : "0";
    if (largeButton) { largeButton.setAttribute("aria-pressed", on ? "true" : "false"); }
  }

  // attn decode's and attn flash's pages: a number of a step (data-step), a tile (data-tile) or
  // the run (data-source="run") is read from that page's data; the trace page's from the trace
  function holder(stage, td) {
    var d = (td && td.dataset) || {};
    if (d.source === "trace" && data.format) { return null; }  // the full row: not embedded
    if (d.step !== undefined) {
      var s = data.steps && data.steps[d.step];
      return (s && s.stages[stage]) || null;
    }
    if (d.tile !== undefined) {
      var t = data.tiles && data.tiles[d.tile];
      return t && t[stage] !== undefined && t[stage] !== null ? { data: t[stage], shape: [0] } : null;
    }
    if (d.source === "run") { return (data.stages && data.stages[stage]) ? { data: data.stages[stage], shape: [0] } : null; }
    return null;
  }

  function value(stage, index, td) {
    var st = data.format ? holder(stage, td) : data.trace.stages[stage];
    if (!st || st.data === undefined) { return null; }
    var kept = (!data.format && data.kept && data.kept[stage]) || null;
    var v = st.data;
    for (var a = 0; a < index.length; a++) {
      var i = index[a];
      if (kept && kept[a]) { i = kept[a].indexOf(i); if (i < 0) { return null; } }
      if (!Array.isArray(v) && st.shape.length === 0) { break; }
      v = v[i];
      if (v === undefined) { return null; }
    }
    return v;
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  function cellText(part) {
    var box = el("div", "worked");
    box.appendChild(el("h3", "", part.title));
    part.lines.forEach(function (line) { box.appendChild(el("div", "line", line)); });
    if (part.header && part.header.length) {
      var table = el("table");
      var tr = el("tr");
      part.header.forEach(function (h) { tr.appendChild(el("th", "", h)); });
      table.appendChild(tr);
      part.rows.forEach(function (row) {
        var r = el("tr");
        row.forEach(function (c) { r.appendChild(el("td", "", c)); });
        table.appendChild(r);
      });
      box.appendChild(table);
    }
    (part.footer || []).forEach(function (line) { box.appendChild(el("div", "line", line)); });
    return box;
  }

  function at(text) {  // "step 3", "tile 2" (data-at, English) in the language shown
    var m = /^([a-z]+) (\d+)$/.exec(text);
    var form = m && data.words[body.dataset.lang]["at_" + m[1]];
    return form ? form.replace("{n}", m[2]) : text;
  }

  function derive(td) {
    var lang = body.dataset.lang;
    var stage = td.dataset.stage;
    var index = td.dataset.index.split(",").filter(function (s) { return s !== ""; }).map(Number);
    panel.textContent = "";
    var where = td.dataset.at ? at(td.dataset.at) + " · " : "";  // a decode step's, a flash tile's
    panel.appendChild(el("h2", "at", where + stage + "[" + index.join(", ") + "]"));
    var v = value(stage, index, td);
    panel.appendChild(el("div", "line", words("shown") + " " + td.dataset.shown));
    if (v !== null) { panel.appendChild(el("div", "line", words("full") + " " + String(v))); }
    var w = td.dataset.w;
    if (w !== undefined && data.derivations[Number(w)]) {
      panel.appendChild(cellText(data.derivations[Number(w)][lang]));
    } else {
      var section = td.closest("section.stage");
      var f = section && section.querySelector(".formula." + lang);
      panel.appendChild(el("div", "line", words("no_cell")));
      if (f) { panel.appendChild(el("div", "line", f.textContent)); }
    }
  }

  function unpin() {
    if (pinned) { pinned.classList.remove("sel"); }
    pinned = null;
    body.dataset.pinned = "0";
  }

  function select(td, pin) {
    if (pin) {
      if (pinned === td) { unpin(); return; }  // a second tap lets go (and closes a phone's panel)
      if (pinned) { pinned.classList.remove("sel"); }
      pinned = td;
      td.classList.add("sel");
      body.dataset.pinned = "1";  // on a narrow screen the panel sits fixed at the bottom
    } else if (pinned) {
      return;  // a pinned cell stays until another is clicked
    }
    derive(td);
    if (pin) { panel.scrollTop = 0; }
  }

  document.addEventListener("click", function (ev) {
    var td = ev.target.closest && ev.target.closest("td[data-stage]");
    if (td) { select(td, true); return; }
    var go = ev.target.closest && ev.target.closest("[data-go]");
    if (go) { show(Number(go.dataset.go)); }
    if (ev.target.closest && ev.target.closest('[data-role="large"]')) { setLarge(!large); remember(); }
    var button = ev.target.closest && ev.target.closest("button");
    if (button) { button.blur(); }  // Space and the arrows step the stages, not the button
  });
  document.addEventListener("mouseover", function (ev) {
    var td = ev.target.closest && ev.target.closest("td[data-stage]");
    if (td) { select(td, false); }
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.altKey || ev.ctrlKey || ev.metaKey) { return; }
    var tag = (ev.target && ev.target.tagName) || "";
    if (tag === "SELECT" || tag === "INPUT" || tag === "TEXTAREA") { return; }
    var k = ev.key;
    if (k === "ArrowRight" || k === " " || k === "PageDown") { show(current + 1); }
    else if (k === "ArrowLeft" || k === "Backspace" || k === "PageUp") { show(current - 1); }
    else if (k === "Home") { show(0); }
    else if (k === "End") { show(sections.length - 1); }
    else if (k === "Escape" && pinned) { unpin(); }
    else if (k === "l" || k === "L") { setLarge(!large); remember(); }
    else { return; }
    ev.preventDefault();
  });

  var langButton = document.querySelector('[data-role="lang"]');
  function setLang(lang) {
    body.dataset.lang = lang;
    document.documentElement.lang = data.lang_tags[lang];
    langButton.textContent = data.words[lang === "en" ? "zh" : "en"].lang_name;
    // where CSS cannot hide a language (an <option> shows text only), the text is swapped
    document.querySelectorAll("[data-text-" + lang + "]").forEach(function (e) {
      e.textContent = e.getAttribute("data-text-" + lang);
    });
    if (sections.length) { title.textContent = named(sections[current]); }
    if (pinned) { derive(pinned); }
    else { panel.textContent = ""; panel.appendChild(el("p", "hint", words("hint"))); }
  }
  langButton.addEventListener("click", function () { setLang(body.dataset.lang === "en" ? "zh" : "en"); });
  var themeButton = document.querySelector('[data-role="theme"]');
  themeButton.addEventListener("click", function () {
    // "auto" follows the system (prefers-color-scheme) until the reader picks the other one
    var dark = body.dataset.theme === "dark" || (body.dataset.theme === "auto" &&
      window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches);
    body.dataset.theme = dark ? "light" : "dark";
  });
  var largeButton = document.querySelector('[data-role="large"]');

  var batchSel = document.querySelector('[data-role="batch"]');
  var headSel = document.querySelector('[data-role="head"]');
  function filter() {
    var b = batchSel ? batchSel.value : "all";
    var h = headSel ? headSel.value : "all";
    document.querySelectorAll("table.m").forEach(function (t) {
      var ok = true;
      if (b !== "all" && t.dataset.batch !== undefined) { ok = ok && t.dataset.batch === b; }
      if (h !== "all" && t.dataset.head !== undefined) { ok = ok && t.dataset.head === h; }
      if (h !== "all" && t.dataset.kvHead !== undefined) {
        ok = ok && Number(t.dataset.kvHead) === Math.floor(Number(h) / data.groups);
      }
      t.hidden = !ok;
    });
  }
  if (batchSel) { batchSel.addEventListener("change", filter); }
  if (headSel) { headSel.addEventListener("change", filter); }

  var start = 0;
  var hash = location.hash.slice(1).split(",");
  sections.forEach(function (s, i) { if (hash.indexOf(s.id) >= 0) { start = i; } });
  setLarge(hash.indexOf("large") >= 0 || body.dataset.large === "1");  // a model view's frame
  // a model view's thumbnail opens a layer's page at a stage, one head shown (model.js)
  var openAt = body.dataset.openStage;
  sections.forEach(function (s, i) { if (openAt && s.dataset.stageName === openAt) { start = i; } });
  if (headSel && body.dataset.openHead !== undefined) { headSel.value = body.dataset.openHead; filter(); }
  show(start, true);
  setLang(body.dataset.lang);
  var opening = document.querySelector("td[data-start]");  // attn trace --cell Q,K
  if (opening) { select(opening, true); }
  // a page opens at its top, the title and stage list in view, whatever section its hash names
  // (the browser scrolls to the element a URL's fragment names: the hash is written back
  // once the page has loaded)
  if (location.hash && history.replaceState) {
    try { history.replaceState(null, "", location.href.split("#")[0]); } catch (e) { /* srcdoc */ }
    window.addEventListener("load", function () { setTimeout(remember, 0); });
  }
  body.dataset.ready = "1";
  body.dataset.initMs = String(Math.round(performance.now() - t0));
  body.dataset.readyMs = String(Math.round(performance.now()));  // from the navigation's start
})();
