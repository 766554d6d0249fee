// The playground's streaming chat (LLM endpoints): the conversation is posted to the console, which
// relays the workers' OpenAI stream (registry/console/chat.py); each server-sent event's delta is
// appended to the answer as it arrives. The answer element counts the events it got
// (data-chunks) and says when the stream ended (data-done).
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    var form = document.getElementById("chat-form");
    if (!form) { return; }
    var log = document.getElementById("chat-log");
    var version = document.getElementById("chat-version");
    var state = document.getElementById("chat-state");
    var send = document.getElementById("chat-send");
    var conversation = [];

    function line(role, text) {
      var p = document.createElement("p");
      p.className = "msg " + role;
      var who = document.createElement("strong");
      who.textContent = role === "user" ? "You: " : role === "assistant" ? "Model: " : "Error: ";
      var body = document.createElement("span");
      body.textContent = text;
      p.appendChild(who);
      p.appendChild(body);
      log.appendChild(p);
      return body;
    }

    function failed(answer, message) {
      answer.parentNode.className = "msg error";
      answer.parentNode.firstChild.textContent = "Error: ";
      answer.textContent = message;
      answer.id = "chat-error";
      state.textContent = "Failed.";
      conversation.pop();  // the question that got no answer is not part of the conversation
    }

    function events(text, each) {
      // "data: {...}" lines of server-sent events; the last, unfinished event is returned to keep
      var blocks = text.replace(/\r\n/g, "\n").split("\n\n");
      var rest = blocks.pop();
      blocks.forEach(function (block) {
        block.split("\n").forEach(function (l) {
          if (l.indexOf("data:") === 0) { each(l.slice(5).trim()); }
        });
      });
      return rest;
    }

    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var input = form.elements.message;
      var text = input.value.trim();
      if (!text) { return; }
      conversation.push({ role: "user", content: text });
      line("user", text);
      input.value = "";
      var old = document.getElementById("chat-answer");
      if (old) { old.removeAttribute("id"); }
      var answer = line("assistant", "");
      answer.id = "chat-answer";
      answer.dataset.chunks = "0";
      var body = new URLSearchParams(new FormData(form));
      body.delete("message");
      body.set("messages", JSON.stringify(conversation));
      send.disabled = true;
      state.textContent = "Streaming…";
      var chunks = 0;
      fetch(form.action, { method: "POST", body: body, credentials: "same-origin" })
        .then(function (r) {
          version.textContent = r.headers.get("X-Model-Version") || "–";
          if (!r.ok || !r.body) {
            return r.text().then(function (t) {
              var said = t;
              try { var doc = JSON.parse(t); said = (doc.error && doc.error.message) || doc.detail || t; } catch (e) { /* not JSON */ }
              failed(answer, r.status + ": " + said);
            });
          }
          var reader = r.body.getReader();
          var decoder = new TextDecoder();
          var buffered = "";
          function pump() {
            return reader.read().then(function (step) {
              if (!step.done) { buffered += decoder.decode(step.value, { stream: true }); }
              buffered = events(buffered + (step.done ? "\n\n" : ""), function (data) {
                if (data === "[DONE]") { return; }
                var doc = JSON.parse(data);
                if (doc.error) { failed(answer, doc.error.message || JSON.stringify(doc.error)); return; }
                var delta = doc.choices && doc.choices[0] && doc.choices[0].delta;
                if (delta && delta.content) {
                  answer.textContent += delta.content;
                  chunks += 1;
                  answer.dataset.chunks = String(chunks);
                }
              });
              if (step.done) {
                if (answer.id === "chat-answer") {
                  conversation.push({ role: "assistant", content: answer.textContent });
                  state.textContent = "Answered in " + chunks + " chunks.";
                }
                return;
              }
              return pump();
            });
          }
          return pump();
        })
        .catch(function (e) { failed(answer, String(e)); })
        .then(function () {
          answer.dataset.done = "1";
          send.disabled = false;
          input.focus();
        });
    });

    document.getElementById("chat-clear").addEventListener("click", function () {
      conversation = [];
      log.textContent = "";
      state.textContent = "Ready.";
    });
  });
})();
