// A terminal into a task over Nomad's exec WebSocket
// (`/v1/client/allocation/:id/exec?task=&tty=true&command=<JSON array>`).
//
// Deliberately small, no terminal emulator: output is text in a <pre> where carriage
// returns, backspaces and line feeds are honoured and other escape sequences
// (colours, cursor movement) are dropped, so full-screen programs (vi, top, less)
// do not draw properly. Keys are sent as a terminal would send them (Enter, Tab,
// Backspace, arrows, Ctrl-letter); on a phone, the line field sends a whole line.

import { token } from "./api.js";
import { h } from "./dom.js";

const enc = new TextEncoder();

function b64(bytes) {
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s);
}

function unb64(text) {
  const s = atob(text);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

const KEYS = {
  Enter: "\r",
  Backspace: "\x7f",
  Tab: "\t",
  Escape: "\x1b",
  ArrowUp: "\x1b[A",
  ArrowDown: "\x1b[B",
  ArrowRight: "\x1b[C",
  ArrowLeft: "\x1b[D",
  Home: "\x1b[H",
  End: "\x1b[F",
  Delete: "\x1b[3~",
  PageUp: "\x1b[5~",
  PageDown: "\x1b[6~",
};

/** What a key press sends, or null for keys a terminal ignores. */
function keyBytes(e) {
  if (e.metaKey) return null;
  if (e.ctrlKey && !e.altKey && e.key.length === 1) {
    const c = e.key.toUpperCase().charCodeAt(0);
    if (c >= 64 && c <= 95) return String.fromCharCode(c - 64);
    return null;
  }
  if (KEYS[e.key]) return KEYS[e.key];
  if (e.key.length === 1 && !e.ctrlKey) return (e.altKey ? "\x1b" : "") + e.key;
  return null;
}

/**
 * A screen of text fed with what the process writes: `\r` returns to the start of
 * the line, `\b` steps back, `\n` starts a new line, escape sequences are dropped.
 */
class Screen {
  constructor(pre) {
    this.pre = pre;
    this.done = []; // finished lines, as one text node
    this.line = "";
    this.col = 0;
    this.esc = ""; // an escape sequence being read
    this.doneNode = document.createTextNode("");
    this.lineNode = document.createTextNode("");
    this.cursor = h("span", { class: "cursor" }, " ");
    pre.append(this.doneNode, this.lineNode, this.cursor);
  }

  write(text) {
    for (const ch of text) {
      if (this.esc) {
        this.esc += ch;
        // CSI: ESC [ params final-byte; OSC: ESC ] ... BEL or ESC \; others: 2 bytes.
        const kind = this.esc[1];
        if (kind === "[") {
          if (this.esc.length > 2 && ch >= "@" && ch <= "~") this.esc = "";
        } else if (kind === "]") {
          if (ch === "\x07" || this.esc.endsWith("\x1b\\")) this.esc = "";
        } else if (this.esc.length >= 2) {
          this.esc = "";
        }
        if (this.esc.length > 256) this.esc = "";
        continue;
      }
      if (ch === "\x1b") this.esc = ch;
      else if (ch === "\r") this.col = 0;
      else if (ch === "\n") {
        this.done.push(this.line);
        this.line = "";
        this.col = 0;
      } else if (ch === "\b") this.col = Math.max(0, this.col - 1);
      else if (ch === "\x07") continue;
      else if (ch < " " && ch !== "\t") continue;
      else {
        this.line = this.line.slice(0, this.col) + ch + this.line.slice(this.col + 1);
        this.col++;
      }
    }
    if (this.done.length > 5000) this.done.splice(0, this.done.length - 5000);
    this.doneNode.data = this.done.length ? this.done.join("\n") + "\n" : "";
    // The cursor sits at `col`: what is right of it is shown after the cursor.
    this.lineNode.data = this.line.slice(0, this.col);
    this.cursor.textContent = this.line[this.col] || " ";
    this.cursor.nextSibling?.remove();
    this.cursor.after(document.createTextNode(this.line.slice(this.col + 1)));
    this.pre.scrollTop = this.pre.scrollHeight;
  }
}

/**
 * The terminal of allocation `allocId`: pick a task and a command, connect.
 * Closed when `signal` aborts.
 */
export function terminal(allocId, tasks, initialTask, signal) {
  const taskSelect = h(
    "select",
    { id: "term-task", "aria-label": "Task" },
    tasks.map((t) => h("option", { value: t, selected: t === initialTask }, t)),
  );
  const command = h("input", {
    id: "term-command",
    type: "text",
    value: "/bin/sh",
    spellcheck: "false",
    autocomplete: "off",
    "aria-label": "Command",
  });
  const connect = h("button", { type: "submit", class: "primary" }, "Connect");
  const status = h("span", { class: "term-status" }, "not connected");
  const pre = h("pre", { class: "term", tabindex: "0", "aria-label": "Terminal output" });
  const lineInput = h("input", {
    type: "text",
    placeholder: "type a line, Enter sends it",
    autocomplete: "off",
    autocapitalize: "off",
    spellcheck: "false",
    "aria-label": "Line to send",
  });
  let ws = null;
  let screen = null;
  pre.append(
    h("span", { class: "term-idle" }, "Not connected. Connect runs the command in the task; type here once connected."),
  );

  function send(obj) {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(obj));
  }
  function sendText(text) {
    send({ stdin: { data: b64(enc.encode(text)) } });
  }
  function size() {
    // Characters that fit: measured on the cursor's box.
    const r = screen?.cursor.getBoundingClientRect();
    const cw = r && r.width ? r.width : 8;
    const ch = r && r.height ? r.height : 16;
    const width = Math.max(20, Math.floor((pre.clientWidth - 16) / cw));
    const height = Math.max(5, Math.floor((pre.clientHeight - 16) / ch));
    return { width, height };
  }

  function open(e) {
    e.preventDefault();
    ws?.close();
    pre.replaceChildren();
    screen = new Screen(pre);
    const argv = command.value.trim().split(/\s+/).filter(Boolean);
    if (!argv.length) {
      status.textContent = "a command is needed";
      return;
    }
    const q = new URLSearchParams({
      task: taskSelect.value,
      tty: "true",
      command: JSON.stringify(argv),
    });
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${scheme}//${location.host}/v1/client/allocation/${encodeURIComponent(allocId)}/exec?${q}`;
    status.textContent = "connecting…";
    status.className = "term-status";
    const sock = new WebSocket(url);
    ws = sock;
    let exited = false;
    sock.onopen = () => {
      // The token goes in the first message (a browser cannot set headers on a
      // WebSocket, and a URL would leak it), as Nomad's UI sends it.
      sock.send(JSON.stringify({ version: 1, auth_token: token() }));
      send({ tty_size: size() });
      status.textContent = "connected";
      status.className = "term-status live";
      pre.focus();
    };
    const decoder = new TextDecoder("utf-8");
    sock.onmessage = (m) => {
      let frame;
      try {
        frame = JSON.parse(m.data);
      } catch (_) {
        return;
      }
      const data = frame.stdout?.data ?? frame.stderr?.data;
      if (data) screen.write(decoder.decode(unb64(data), { stream: true }));
      if (frame.exited) {
        exited = true;
        const code = frame.result?.exit_code ?? 0;
        status.textContent = `exited with code ${code}`;
        status.className = code === 0 ? "term-status" : "term-status error";
      }
    };
    sock.onclose = (ev) => {
      if (ws === sock) ws = null;
      if (!exited) {
        status.textContent = ev.reason ? `closed: ${ev.reason}` : `closed (code ${ev.code})`;
        status.className = "term-status error";
      }
    };
  }

  pre.addEventListener("keydown", (e) => {
    const bytes = keyBytes(e);
    if (bytes === null) return;
    e.preventDefault();
    sendText(bytes);
  });
  pre.addEventListener("paste", (e) => {
    e.preventDefault();
    sendText(e.clipboardData.getData("text"));
  });
  lineInput.addEventListener("keydown", (e) => {
    if (e.key !== "Enter") return;
    e.preventDefault();
    sendText(lineInput.value + "\r");
    lineInput.value = "";
  });
  const resize = new ResizeObserver(() => send({ tty_size: size() }));
  resize.observe(pre);
  signal.addEventListener("abort", () => {
    resize.disconnect();
    ws?.close();
  });

  return h(
    "div",
    { class: "terminal" },
    h(
      "form",
      { class: "term-bar", onsubmit: open },
      h("label", { for: "term-task" }, "Task"),
      taskSelect,
      h("label", { for: "term-command" }, "Command"),
      command,
      connect,
      status,
    ),
    pre,
    h(
      "div",
      { class: "term-line" },
      lineInput,
      h(
        "button",
        { type: "button", onclick: () => sendText("\x03"), title: "Send Ctrl-C" },
        "Ctrl-C",
      ),
      h(
        "button",
        { type: "button", onclick: () => send({ stdin: { close: true } }), title: "Close stdin (Ctrl-D)" },
        "EOF",
      ),
    ),
    h(
      "p",
      { class: "hint" },
      "A plain terminal: keys go to the process; colours and cursor movement are not drawn, so full-screen programs (vi, top) do not display properly.",
    ),
  );
}
