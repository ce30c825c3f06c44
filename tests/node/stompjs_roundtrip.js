// @stomp/stompjs against Curb's /ws, as a web page would use it (brokerURL, 10 s
// heart-beats): publish a text and a binary message with receipts, consume both with
// client-individual ACKs, and print what came back as one JSON line.
// Usage: node stompjs_roundtrip.js ws://127.0.0.1:PORT/ws [login passcode]
const { Client } = require("@stomp/stompjs");
const WebSocket = require("ws");
Object.assign(global, { WebSocket });

const [url, login, passcode] = process.argv.slice(2);
const client = new Client({
  brokerURL: url,
  connectHeaders: login ? { login, passcode } : {},
  heartbeatIncoming: 10000,
  heartbeatOutgoing: 10000,
  reconnectDelay: 0,
});
const got = [];
let finished = false;
const done = (result) => {
  if (finished) return;
  finished = true;
  console.log(JSON.stringify(result));
  client.deactivate().then(() => process.exit(0));
};
setTimeout(() => done({ error: "timed out", got }), 15000);
client.onStompError = (frame) => done({ error: frame.headers.message, got });
client.onWebSocketClose = (event) => done({ error: `closed ${event.code}`, got });
client.onConnect = (connected) => {
  const receipts = [];
  const maybeDone = () => {
    if (got.length === 2 && receipts.length === 2)
      done({ version: connected.headers.version, heartBeat: connected.headers["heart-beat"], receipts, got });
  };
  for (const id of ["r1", "r2"])
    client.watchForReceipt(id, () => {
      receipts.push(id);
      maybeDone();
    });
  client.publish({ destination: "/queue/curb", body: "hello from stompjs", headers: { receipt: "r1", "x-from": "js" } });
  client.publish({ destination: "/queue/curb", binaryBody: new Uint8Array([0, 255, 1, 128]), headers: { receipt: "r2" } });
  client.subscribe(
    "/queue/curb",
    (message) => {
      got.push({ text: message.body, bytes: Array.from(message.binaryBody), headers: message.headers });
      message.ack();
      maybeDone();
    },
    { ack: "client-individual" },
  );
};
client.activate();
