// toolgate admin: small progressive enhancements. Every page works without this file.
// Text from the server is only ever set with textContent, never parsed as HTML.
(function () {
  "use strict";

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function editorLink(agent, target) {
    var a = el("a");
    a.href = "/admin/grants/new?agent=" + encodeURIComponent(agent || "") +
      "&target=" + encodeURIComponent(target);
    a.appendChild(el("code", "", target));
    return a;
  }

  function renderPreview(box, data, agent) {
    box.replaceChildren();
    if (data.error) {
      box.appendChild(el("p", "preview-bad", data.error));
      return;
    }
    if (data.matched_tools === 0) {
      var problem = el("div", "problem");
      problem.dataset.problem = "zero-match";
      problem.appendChild(el("span", "problem-tag", "Zero match"));
      problem.appendChild(el("code", "", data.target));
      problem.appendChild(document.createTextNode(" matches no tool. "));
      if (data.suggestions.length > 0) {
        var s = el("span", "suggestion", "Did you mean ");
        s.appendChild(editorLink(agent, data.suggestions[0]));
        s.appendChild(document.createTextNode("?"));
        problem.appendChild(s);
        data.suggestions.slice(1).forEach(function (other) {
          problem.appendChild(document.createTextNode(" "));
          problem.appendChild(editorLink(agent, other));
        });
      } else {
        problem.appendChild(el("span", "muted", "No existing group or tool has a similar name."));
      }
      box.appendChild(problem);
      return;
    }
    var p = el("p", "preview-good");
    p.appendChild(el("code", "", data.target));
    p.appendChild(document.createTextNode(" matches " + data.matched_tools + " tool(s):"));
    box.appendChild(p);
    var list = el("ul", "tool-list");
    data.tools.forEach(function (name) {
      var li = el("li");
      li.appendChild(el("code", "", name));
      list.appendChild(li);
    });
    box.appendChild(list);
  }

  document.querySelectorAll("input[data-live-preview]").forEach(function (input) {
    var box = document.getElementById(input.dataset.livePreview);
    if (!box) return;
    var timer = null;
    var latest = 0;
    input.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () {
        var target = input.value.trim();
        var mine = ++latest;
        if (!target) {
          box.replaceChildren();
          return;
        }
        fetch("/admin/grants/preview?target=" + encodeURIComponent(target), {
          headers: { accept: "application/json" },
          credentials: "same-origin",
        })
          .then(function (r) { return r.ok ? r.json() : null; })
          .then(function (data) {
            if (!data || mine !== latest) return;
            var agentField = input.form && input.form.elements.namedItem("agent");
            renderPreview(box, data, agentField ? agentField.value : "");
          })
          .catch(function () { /* the Preview button still works */ });
      }, 180);
    });
  });

  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    var source = document.getElementById(button.dataset.copy);
    if (!source || !navigator.clipboard) return;
    button.hidden = false;
    button.addEventListener("click", function () {
      navigator.clipboard.writeText(source.textContent.trim()).then(function () {
        button.textContent = "Copied";
      });
    });
  });
})();
