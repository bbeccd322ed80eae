"use strict";
// attn's model view page: language, theme, the status line of a hovered weight, and a
// thumbnail's click opening its layer's trace page (page.js) in a sandboxed srcdoc frame.
// Every text comes from the page's data (made in Python); text is written through textContent.
(function () {
  var data = JSON.parse(document.getElementById("attn-data").textContent);
  var body = document.body;
  var model = document.querySelector('[data-role="model"]');
  var panel = document.querySelector('[data-role="layer"]');
  var frameBox = document.querySelector('[data-role="frame"]');
  var layerTitle = document.querySelector('[data-role="layer-title"]');
  var noTrace = document.querySelector('[data-role="no-trace"]');
  var status = document.querySelector('[data-role="status"]');
  var opened = null;  // [layer, head] in view

  function words(key) { return data.words[body.dataset.lang][key]; }
  function fill(text, values) {
    return text.replace(/\{(\w+)\}/g, function (m, k) { return values[k] === undefined ? m : String(values[k]); });
  }
  function span(i) {  // the tokens a pooled row or column covers
    if (!data.edges) { return data.tokens[i]; }
    var a = data.edges[i], b = data.edges[i + 1] - 1;
    return a === b ? data.tokens[a] : data.tokens[a] + "…" + data.tokens[b] + " (" + a + "–" + b + ")";
  }

  function describe(td) {
    var fig = td.closest("figure.thumb");
    var ij = td.dataset.index.split(",").map(Number);
    var key = data.edges ? "pooled_status" : "status";
    status.textContent = fill(words(key), {
      layer: fig.dataset.layer, head: fig.dataset.head, q: span(ij[0]), k: span(ij[1]), w: td.dataset.shown
    }) + " · " + words("kind")[fig.dataset.kind];
  }

  function open(layer, head) {
    opened = [layer, head];
    layerTitle.textContent = fill(words("layer_title"), { layer: layer, head: head });
    frameBox.textContent = "";
    var page = data.pages[String(layer)];
    model.hidden = true;
    panel.hidden = false;
    if (!page) {
      noTrace.hidden = false;
      noTrace.textContent = fill(words("no_trace"), { layer: layer, cap: data.cap_mb, ckpt: data.checkpoint });
      return;
    }
    noTrace.hidden = true;
    var tag = '<body data-lang="' + body.dataset.lang + '" data-theme="' + body.dataset.theme +
      '" data-large="' + (body.dataset.large === "1" ? "1" : "0") +
      '" data-open-stage="' + data.open_stage + '" data-open-head="' + Number(head) + '" data-ready="0">';
    var asked = opened;
    unzip(page[0]).then(function (text) {
      if (opened !== asked) { return; }  // another thumbnail was clicked meanwhile
      var frame = document.createElement("iframe");
      frame.setAttribute("sandbox", "allow-scripts");
      frame.setAttribute("title", layerTitle.textContent);
      frame.addEventListener("load", function () { frame.contentWindow.focus(); });  // its keys
      frame.srcdoc = text.replace(page[1], tag);  // the first <body ...>: the page's own
      frameBox.textContent = "";
      frameBox.appendChild(frame);
    });
  }

  function unzip(b64) {  // a layer's page: gzip in base64 (present/model_page.py LayerPages)
    var raw = atob(b64);
    var bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) { bytes[i] = raw.charCodeAt(i); }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Response(stream).text();
  }

  function close() {
    opened = null;
    frameBox.textContent = "";
    panel.hidden = true;
    model.hidden = false;
  }

  document.addEventListener("mouseover", function (ev) {
    var td = ev.target.closest && ev.target.closest("figure.thumb td");
    if (td) { describe(td); }
  });
  document.addEventListener("click", function (ev) {
    var fig = ev.target.closest && ev.target.closest("figure.thumb");
    if (fig) { open(Number(fig.dataset.layer), Number(fig.dataset.head)); return; }
    var whole = ev.target.closest && ev.target.closest("[data-open-layer]");  // no map to click
    if (whole) { open(Number(whole.dataset.openLayer), 0); return; }
    var back = ev.target.closest && ev.target.closest('[data-role="back"]');
    if (back) { close(); }
    if (ev.target.closest && ev.target.closest('[data-role="large"]')) { toggleLarge(); }
  });
  function toggleLarge() {  // the projector's larger type, here and in a layer's page
    body.dataset.large = body.dataset.large === "1" ? "0" : "1";
    if (opened) { open(opened[0], opened[1]); }
  }
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Escape" && opened) { close(); ev.preventDefault(); return; }
    if ((ev.key === "l" || ev.key === "L") && !ev.altKey && !ev.ctrlKey && !ev.metaKey) {
      toggleLarge(); ev.preventDefault(); return;
    }
    var fig = ev.target.closest && ev.target.closest("figure.thumb");
    if (fig && (ev.key === "Enter" || ev.key === " ")) {
      open(Number(fig.dataset.layer), Number(fig.dataset.head));
      ev.preventDefault();
    }
  });

  var langButton = document.querySelector('[data-role="lang"]');
  function setLang(lang) {
    body.dataset.lang = lang;
    document.documentElement.lang = data.lang_tags[lang];
    langButton.textContent = data.words[lang === "en" ? "zh" : "en"].lang_name;
    status.textContent = "";
    if (opened) { open(opened[0], opened[1]); }  // the layer's page again, in this language
  }
  langButton.addEventListener("click", function () { setLang(body.dataset.lang === "en" ? "zh" : "en"); });
  document.querySelector('[data-role="theme"]').addEventListener("click", function () {
    // "auto" follows the system (prefers-color-scheme) until the reader picks the other one
    var dark = body.dataset.theme === "dark" || (body.dataset.theme === "auto" &&
      window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches);
    body.dataset.theme = dark ? "light" : "dark";
    if (opened) { open(opened[0], opened[1]); }
  });
  setLang(body.dataset.lang);
  body.dataset.ready = "1";
})();
