// Curb's console page: the live feed (/console/live) for counts, rates and connections,
// and a small STOMP client over /ws for the browse and the publish box. No library, no
// build step; Curb sends one STOMP frame per WebSocket message, which keeps the parser short.
// A router's feed has `destinations`: the page then shows them and their instances, and
// its browses and publish box act on the destination picked.
"use strict";

const wsBase = (location.protocol === "https:" ? "wss://" : "ws://") + location.host;
const $ = (id) => document.getElementById(id);
let credentials = {};
let stomp = null;

function escapeHeader(value) {
  return String(value).replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/\r/g, "\\r").replace(/:/g, "\\c");
}

function unescapeHeader(value) {
  return value.replace(/\\(.)/g, (_, c) => ({ n: "\n", r: "\r", c: ":", "\\": "\\" })[c] ?? c);
}

// One STOMP 1.2 connection over /ws: frame(command, headers, body), callbacks per
// subscription and per receipt.
class Stomp {
  constructor(onReady, onError) {
    this.subscriptions = new Map();
    this.receipts = new Map();
    this.waiting = []; // frames asked for before CONNECTED: sent once it comes
    this.connected = false;
    this.ws = new WebSocket(wsBase + "/ws", ["v12.stomp"]);
    this.ws.binaryType = "arraybuffer";
    this.ws.onopen = () => {
      const login = credentials.login ? { login: credentials.login, passcode: credentials.passcode } : {};
      this.frame("CONNECT", { "accept-version": "1.2", host: location.hostname, "heart-beat": "0,0", ...login });
    };
    this.ws.onmessage = (event) => {
      const text = typeof event.data === "string" ? event.data : new TextDecoder().decode(event.data);
      if (text === "\n") return; // a heart-beat
      const [command, headers, body] = parse(text);
      if (command === "CONNECTED") {
        this.connected = true;
        for (const waiting of this.waiting.splice(0)) this.ws.send(waiting);
        onReady();
      }
      else if (command === "MESSAGE") this.subscriptions.get(headers.subscription)?.(headers, body);
      else if (command === "RECEIPT") this.receipts.get(headers["receipt-id"])?.(headers);
      else if (command === "ERROR") onError(`${headers.message}: ${body}`);
    };
    this.ws.onclose = () => onError("the STOMP connection closed");
  }

  frame(command, headers, body = "") {
    const lines = Object.entries(headers).map(([k, v]) => `${escapeHeader(k)}:${escapeHeader(v)}`);
    const text = `${command}\n${lines.join("\n")}\n\n${body}\0`;
    if (this.connected || command === "CONNECT") this.ws.send(text);
    else this.waiting.push(text);
  }
}

function parse(text) {
  const end = text.indexOf("\n\n");
  const [command, ...lines] = text.slice(0, end).replace(/^\n+/, "").split("\n");
  const headers = {};
  for (const line of lines) {
    const colon = line.indexOf(":");
    const name = unescapeHeader(line.slice(0, colon));
    if (!(name in headers)) headers[name] = unescapeHeader(line.slice(colon + 1));
  }
  let body = text.slice(end + 2);
  body = body.slice(0, body.lastIndexOf("\0"));
  return [command, headers, body];
}

function cell(row, text, pre = false) {
  const td = row.insertCell();
  if (pre) {
    const block = document.createElement("pre");
    block.textContent = text;
    td.appendChild(block);
  } else td.textContent = text;
}

const CHART_POINTS = 300; // five minutes of the feed's (at most) once-a-second snapshots
const CHART = { sent: "#1565c0", delivered: "#2e7d32", acked: "#ef6c00" };
const history = []; // [{at, sent, delivered, acked}], oldest first

function chart(snapshot) {
  const now = Date.now();
  const last = history[history.length - 1];
  if (last === undefined || now - last.at >= 1000) history.push({ at: now, ...snapshot.rates });
  while (history.length > CHART_POINTS) history.shift();
  const canvas = $("chart");
  const g = canvas.getContext("2d");
  g.clearRect(0, 0, canvas.width, canvas.height);
  const top = Math.max(1, ...history.flatMap((p) => Object.keys(CHART).map((k) => p[k])));
  g.fillStyle = "#666";
  g.fillText(`${top}/s`, 4, 12);
  for (const [name, color] of Object.entries(CHART)) {
    g.strokeStyle = color;
    g.beginPath();
    history.forEach((p, i) => {
      const x = (canvas.width * (i + CHART_POINTS - history.length)) / (CHART_POINTS - 1);
      const y = canvas.height - 2 - ((canvas.height - 16) * p[name]) / top;
      if (i === 0) g.moveTo(x, y);
      else g.lineTo(x, y);
    });
    g.stroke();
  }
}

function mib(bytes) {
  return (bytes / (1 << 20)).toFixed(1);
}

// The STOMP destinations the browses, the publish box and the redrive name: the broker's
// one queue, or on a router the routed destination picked.
function target() {
  const name = $("destination").value;
  if (!name) return { queue: "/queue/curb", dead: "./dead", redrive: "./redrive" };
  return { queue: `/queue/${name}`, dead: `./${name}/dead`, redrive: `./${name}/redrive` };
}

function show(snapshot) {
  for (const key of ["rdy", "wip", "delayed", "dead", "subscriptions", "connections"]) $(key).textContent = snapshot[key];
  $("log-box").hidden = snapshot.cap === undefined; // a router has no log of its own
  if (snapshot.cap !== undefined) $("log-use").textContent = `${mib(snapshot.log_bytes)} / ${mib(snapshot.cap)} MiB`;
  for (const [name, rate] of Object.entries(snapshot.rates)) $(`rate-${name}`).textContent = rate;
  chart(snapshot);
  const body = $("clients").tBodies[0];
  body.replaceChildren();
  for (const client of snapshot.clients) {
    const row = body.insertRow();
    cell(row, client.peer);
    cell(row, client.user ?? "");
    const prefetch = client.prefetch ?? "not subscribed";
    cell(row, client.destination === undefined ? prefetch : `${client.destination}: ${prefetch}`);
    cell(row, client.inflight);
  }
  if (snapshot.destinations !== undefined) showRouted(snapshot.destinations);
}

// A router's destinations (counts of the instances up, rates) and each instance's links
// and counts; the picker offers the destinations.
function showRouted(destinations) {
  $("routed").hidden = false;
  $("picker").hidden = false;
  const picker = $("destination");
  const names = Object.keys(destinations);
  if ([...picker.options].map((o) => o.value).join("\n") !== names.join("\n")) {
    const picked = picker.value;
    picker.replaceChildren(...names.map((name) => new Option(name, name)));
    if (names.includes(picked)) picker.value = picked;
  }
  const dests = $("destinations").tBodies[0];
  const instances = $("instances").tBodies[0];
  dests.replaceChildren();
  instances.replaceChildren();
  for (const [name, dest] of Object.entries(destinations)) {
    const row = dests.insertRow();
    cell(row, name);
    for (const key of ["rdy", "wip", "delayed", "dead", "subscriptions"]) cell(row, dest[key]);
    cell(row, `${dest.up} of ${Object.keys(dest.instances).length}`);
    for (const rate of ["sent", "delivered", "acked", "nacked"]) cell(row, dest.rates[rate]);
    for (const [where, instance] of Object.entries(dest.instances)) {
      const line = instances.insertRow();
      cell(line, name);
      cell(line, where);
      for (const link of ["sends_link", "consumes_link"]) {
        cell(line, instance[link]);
        if (instance[link] !== "up") line.cells[line.cells.length - 1].className = "down";
      }
      for (const key of ["rdy", "wip", "delayed", "dead"]) cell(line, instance[key]);
    }
  }
}

function live() {
  const ws = new WebSocket(wsBase + "/console/live");
  ws.onopen = () => ws.send(JSON.stringify(credentials));
  ws.onmessage = (event) => {
    const data = JSON.parse(event.data);
    if ("code" in data) {
      if (data.code === 401 || data.code === 403) askLogin(data.error);
      else $("status").textContent = data.error;
      return;
    }
    $("status").textContent = "live";
    if (stomp === null) connectStomp(); // logged in (or no -users): no refused CONNECT is counted
    show(data);
  };
  ws.onclose = () => {
    if ($("status").textContent === "live") $("status").textContent = "disconnected";
  };
}

function askLogin(error) {
  $("login").hidden = false;
  $("login-error").textContent = credentials.login ? error : "";
  $("status").textContent = "log in";
}

function connectStomp() {
  stomp = new Stomp(
    () => {
      browse();
      browseDead();
    },
    (error) => {
      $("published").textContent = error;
      $("published").className = "error";
    },
  );
}

const BROWSE_SHOWN = 20;
let browses = 0;
const browsing = new Map(); // tables -> the id of the browse under way that fills them

// The first BROWSE_SHOWN messages of a browse of `destination`, each shown by
// `fill(headers, body, position)` in one of `tables` (emptied first); a browse asked for
// again (of the same destination or, once another is picked, of that one) replaces it.
function browseInto(destination, tables, fill) {
  const old = browsing.get(tables.join());
  if (old !== undefined && stomp.subscriptions.delete(old)) stomp.frame("UNSUBSCRIBE", { id: old });
  const id = `browse-${++browses}`;
  browsing.set(tables.join(), id);
  for (const table of tables) $(table).tBodies[0].replaceChildren();
  let shown = 0;
  stomp.subscriptions.set(id, (headers, text) => {
    if (headers.browser === "end" || shown >= BROWSE_SHOWN) {
      stomp.subscriptions.delete(id);
      if (headers.browser !== "end") stomp.frame("UNSUBSCRIBE", { id });
      return;
    }
    shown += 1;
    fill(headers, text, shown);
  });
  stomp.frame("SUBSCRIBE", { id, destination, browser: "true" });
}

// The queue's messages: those ready, in the order they are delivered ("Next messages"),
// and those delayed (a browse MESSAGE with curb-due, ms since the epoch) by due time,
// with it, since they are not delivered before it.
function browse() {
  browseInto(target().queue, ["messages", "delayed-messages"], (headers, text) => {
    const own = ["subscription", "destination", "message-id", "content-length", "curb-due"];
    const kept = Object.entries(headers).filter(([k]) => !own.includes(k));
    const due = headers["curb-due"];
    let row;
    if (due === undefined) row = $("messages").tBodies[0].insertRow();
    else {
      const rows = [...$("delayed-messages").tBodies[0].rows];
      const after = rows.findIndex((r) => Number(r.dataset.due) > Number(due));
      row = $("delayed-messages").tBodies[0].insertRow(after);
      row.dataset.due = due;
    }
    cell(row, headers["message-id"]);
    if (due !== undefined) cell(row, `${new Date(Number(due)).toISOString().slice(0, 19).replace("T", " ")}Z`);
    cell(row, kept.map(([k, v]) => `${k}: ${v}`).join("\n"), true);
    cell(row, text, true);
  });
}

// The dead letters, oldest first (a browse of ./dead: nothing changes), with their reason
// and count, and a button that deletes each.
function browseDead() {
  browseInto(target().dead, ["dead-letters"], (headers, text, position) => {
    const row = $("dead-letters").tBodies[0].insertRow();
    cell(row, headers["message-id"]);
    cell(row, headers["curb-dead-reason"] ?? "");
    cell(row, headers["curb-deliveries"] ?? "");
    cell(row, text, true);
    const button = document.createElement("button");
    button.textContent = "Delete";
    button.className = "delete";
    button.addEventListener("click", () => deleteDead(headers["message-id"], position));
    row.insertCell().appendChild(button);
  });
}

// Delete one dead letter for good: read ./dead (oldest first) as far as it, stop reading,
// give back the ones before it (a NACK on ./dead leaves a letter dead) and ACK it.
function deleteDead(messageId, position) {
  const id = `delete-${++browses}`;
  const held = [];
  let found = false;
  $("redriven").textContent = `deleting ${messageId}…`;
  // Stop reading; letters sent before the broker had the UNSUBSCRIBE come before its
  // RECEIPT and are given back as they come (`found`), then the subscription is forgotten.
  const unsubscribe = () => {
    found = true;
    const receipt = `stopped-${id}`;
    stomp.receipts.set(receipt, () => {
      stomp.receipts.delete(receipt);
      stomp.subscriptions.delete(id);
    });
    stomp.frame("UNSUBSCRIBE", { id, receipt });
    for (const ack of held) stomp.frame("NACK", { id: ack });
  };
  const stop = (text) => {
    $("redriven").textContent = text;
    browseDead();
  };
  const timer = setTimeout(() => {
    unsubscribe();
    stop(`${messageId} not found (held by a reader of ./dead?)`);
  }, 5000);
  stomp.subscriptions.set(id, (headers) => {
    if (found) {
      stomp.frame("NACK", { id: headers.ack }); // sent before the broker had the UNSUBSCRIBE
      return;
    }
    if (headers["message-id"] !== messageId) {
      held.push(headers.ack);
      return;
    }
    clearTimeout(timer);
    unsubscribe(); // first: what is given back is not handed to it again
    const receipt = `deleted-${id}`;
    stomp.receipts.set(receipt, () => {
      stomp.receipts.delete(receipt);
      stop(`${messageId} deleted`);
    });
    stomp.frame("ACK", { id: headers.ack, receipt });
  });
  stomp.frame("SUBSCRIBE", {
    id,
    destination: target().dead,
    ack: "client-individual",
    "prefetch-count": String(position),
  });
}

let redrives = 0;

function redrive() {
  const receipt = `redrive-${++redrives}`;
  $("redriven").textContent = "redriving…";
  stomp.receipts.set(receipt, (headers) => {
    stomp.receipts.delete(receipt);
    $("redriven").textContent = `${headers["curb-moved"]} moved back to the queue`;
    browseDead();
    browse();
  });
  stomp.frame("SEND", { destination: target().redrive, receipt });
}

let sends = 0;

function publish(event) {
  event.preventDefault();
  const form = $("publish");
  const receipt = `send-${++sends}`;
  $("published").textContent = "sending…";
  $("published").className = "";
  stomp.receipts.set(receipt, () => {
    stomp.receipts.delete(receipt);
    $("published").textContent = `stored (${receipt})`;
    browse();
  });
  stomp.frame("SEND", { destination: target().queue, "content-type": form.type.value, receipt }, form.body.value);
}

function start() {
  $("publish").addEventListener("submit", publish);
  $("browse").addEventListener("click", () => browse());
  $("browse-dead").addEventListener("click", () => browseDead());
  $("redrive").addEventListener("click", () => redrive());
  $("destination").addEventListener("change", () => {
    browse();
    browseDead();
  });
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    credentials = { login: $("login").login.value, passcode: $("login").passcode.value };
    $("login").hidden = true;
    stomp = null;
    live();
  });
  live();
}

document.addEventListener("DOMContentLoaded", start);
