// A fedstream client written from docs/protocol.md alone, in Node.js with its standard library
// only (a small msgpack codec included), run with `node --test` against a real peer by
// tests/integration/test_node_client.py (PEER_ADDR=HOST:PORT, loopback: plain TCP). It
// checks the document's promises, so that the document cannot drift from the server.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";

// -- msgpack (docs/protocol.md section 1: the types used) ------------------------------------

function encode(value) {
  const parts = [];
  const byte = (...b) => parts.push(Buffer.from(b));
  const put = (v) => {
    if (v === null || v === undefined) byte(0xc0);
    else if (v === false) byte(0xc2);
    else if (v === true) byte(0xc3);
    else if (typeof v === "bigint") {
      const b = Buffer.alloc(9);
      if (v < 0n) { b[0] = 0xd3; b.writeBigInt64BE(v, 1); } else { b[0] = 0xcf; b.writeBigUInt64BE(v, 1); }
      parts.push(b);
    } else if (typeof v === "number" && Number.isInteger(v) && !Object.is(v, -0)) {
      if (v >= 0 && v < 128) byte(v);
      else if (v < 0 && v >= -32) byte(v & 0xff);
      else put(BigInt(v));
    } else if (typeof v === "number") {
      const b = Buffer.alloc(9); b[0] = 0xcb; b.writeDoubleBE(v, 1); parts.push(b);
    } else if (typeof v === "string") {
      const s = Buffer.from(v, "utf8");
      if (s.length < 32) byte(0xa0 | s.length);
      else { const h = Buffer.alloc(5); h[0] = 0xdb; h.writeUInt32BE(s.length, 1); parts.push(h); }
      parts.push(s);
    } else if (v instanceof Uint8Array) {
      const h = Buffer.alloc(5); h[0] = 0xc6; h.writeUInt32BE(v.length, 1); parts.push(h, Buffer.from(v));
    } else if (Array.isArray(v)) {
      const h = Buffer.alloc(5); h[0] = 0xdd; h.writeUInt32BE(v.length, 1); parts.push(h);
      v.forEach(put);
    } else if (typeof v === "object") {
      const keys = Object.keys(v);
      const h = Buffer.alloc(5); h[0] = 0xdf; h.writeUInt32BE(keys.length, 1); parts.push(h);
      for (const k of keys) { put(k); put(v[k]); }
    } else throw new TypeError(`cannot encode ${typeof v}`);
  };
  put(value);
  return Buffer.concat(parts);
}

// Integers beyond 2^53 decode as BigInt (docs: JavaScript numbers lose precision there).
function decode(buf) {
  let pos = 0;
  const int = (n, signed) => {
    const v = signed ? buf.readBigInt64BE(pos) : buf.readBigUInt64BE(pos);
    pos += n;
    return v >= -(2n ** 53n) && v <= 2n ** 53n ? Number(v) : v;
  };
  const str = (n) => { const s = buf.toString("utf8", pos, pos + n); pos += n; return s; };
  const arr = (n) => Array.from({ length: n }, () => get());
  const map = (n) => { const o = {}; for (let i = 0; i < n; i++) { const k = get(); assert.equal(typeof k, "string"); o[k] = get(); } return o; };
  const get = () => {
    const t = buf[pos++];
    if (t < 0x80) return t;
    if (t >= 0xe0) return t - 0x100;
    if ((t & 0xf0) === 0x80) return map(t & 0x0f);
    if ((t & 0xf0) === 0x90) return arr(t & 0x0f);
    if ((t & 0xe0) === 0xa0) return str(t & 0x1f);
    switch (t) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: { const n = buf[pos]; pos += 1; const b = buf.subarray(pos, pos + n); pos += n; return b; }
      case 0xc5: { const n = buf.readUInt16BE(pos); pos += 2; const b = buf.subarray(pos, pos + n); pos += n; return b; }
      case 0xc6: { const n = buf.readUInt32BE(pos); pos += 4; const b = buf.subarray(pos, pos + n); pos += n; return b; }
      case 0xca: { const v = buf.readFloatBE(pos); pos += 4; return v; }
      case 0xcb: { const v = buf.readDoubleBE(pos); pos += 8; return v; }
      case 0xcc: return buf[pos++];
      case 0xcd: { const v = buf.readUInt16BE(pos); pos += 2; return v; }
      case 0xce: { const v = buf.readUInt32BE(pos); pos += 4; return v; }
      case 0xcf: return int(8, false);
      case 0xd0: return buf.readInt8(pos++);
      case 0xd1: { const v = buf.readInt16BE(pos); pos += 2; return v; }
      case 0xd2: { const v = buf.readInt32BE(pos); pos += 4; return v; }
      case 0xd3: return int(8, true);
      case 0xd9: { const n = buf[pos++]; return str(n); }
      case 0xda: { const n = buf.readUInt16BE(pos); pos += 2; return str(n); }
      case 0xdb: { const n = buf.readUInt32BE(pos); pos += 4; return str(n); }
      case 0xdc: { const n = buf.readUInt16BE(pos); pos += 2; return arr(n); }
      case 0xdd: { const n = buf.readUInt32BE(pos); pos += 4; return arr(n); }
      case 0xde: { const n = buf.readUInt16BE(pos); pos += 2; return map(n); }
      case 0xdf: { const n = buf.readUInt32BE(pos); pos += 4; return map(n); }
      default: throw new Error(`msgpack type 0x${t.toString(16)} is not used by fedstream`);
    }
  };
  const value = get();
  assert.equal(pos, buf.length, "one msgpack value per frame");
  return value;
}

// -- a connection: frames, requests matched by id, subscriptions ------------------------------

class Connection {
  constructor(host, port) {
    this.nextId = 1;
    this.waiting = new Map(); // request id -> resolve
    this.subs = new Map(); // subscription id -> frames received
    this.notices = []; // error frames with id nil
    this.buffer = Buffer.alloc(0);
    this.socket = net.connect(port, host);
    this.socket.on("data", (chunk) => this.receive(chunk));
    this.ready = new Promise((resolve, reject) => {
      this.socket.once("connect", resolve);
      this.socket.once("error", reject);
    });
  }

  // Every frame of one read is handled here, synchronously: a subscription is registered
  // the moment its ok reply is decoded, before any batch frame that followed it in the read.
  receive(chunk) {
    this.buffer = Buffer.concat([this.buffer, chunk]);
    while (this.buffer.length >= 4) {
      const n = this.buffer.readUInt32BE(0);
      if (this.buffer.length < 4 + n) break;
      const frame = decode(this.buffer.subarray(4, 4 + n));
      this.buffer = this.buffer.subarray(4 + n);
      if (typeof frame.subscription === "number" && frame.type !== "ok") {
        const frames = this.subs.get(frame.subscription);
        assert.ok(frames, `a ${frame.type} frame for unknown subscription ${frame.subscription}`);
        frames.push(frame);
      } else if (frame.id === null) {
        this.notices.push(frame);
      } else {
        const done = this.waiting.get(frame.id);
        assert.ok(done, `a reply to request ${frame.id}, which nobody waits for`);
        this.waiting.delete(frame.id);
        if (frame.type === "ok" && typeof frame.result?.subscription === "number" && !this.subs.has(frame.result.subscription)) {
          this.subs.set(frame.result.subscription, []);
        }
        done(frame);
      }
    }
  }

  sendFrame(frame) {
    const body = encode(frame);
    const head = Buffer.alloc(4);
    head.writeUInt32BE(body.length);
    this.socket.write(Buffer.concat([head, body]));
  }

  request(op, args = {}) {
    const id = this.nextId++;
    const reply = new Promise((resolve) => this.waiting.set(id, resolve));
    this.sendFrame({ type: op, id, ...args });
    return reply;
  }

  async ok(op, args) {
    const reply = await this.request(op, args);
    assert.equal(reply.type, "ok", `${op}: ${JSON.stringify(reply)}`);
    return reply.result;
  }

  // A SQL script (docs/sql.md) for the peer to compile and create, in script order
  // (docs/protocol.md, create_sql): its source streams, then its queries, started if asked.
  async submitSql(sql, { name = "query", start = false, namespace = "" } = {}) {
    return this.ok("create_sql", { sql, name, ...(start ? { start } : {}), ...(namespace ? { namespace } : {}) });
  }

  // Any query definition: SQL text goes as create_sql, Medusa/Borealis XML and JSON (text or
  // an object) as create_query (docs/protocol.md tells them apart by the first character).
  async createQuery(definition, name = "query") {
    if (typeof definition === "string" && !/^\s*[<{[]/.test(definition)) return this.submitSql(definition, { name });
    return this.ok("create_query", { query: definition });
  }

  async until(probe, what, timeoutMs = 15000) {
    const deadline = Date.now() + timeoutMs;
    while (!probe()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  close() { this.socket.destroy(); }
}

// -- the checks --------------------------------------------------------------------------------

const [host, port] = (process.env.PEER_ADDR ?? "127.0.0.1:7700").split(":");
const tag = `n${process.pid}`;
let c;

before(async () => { c = new Connection(host, Number(port)); await c.ready; });
after(() => c.close());

test("hello: version, frame limit; another version is refused", async () => {
  const result = await c.ok("hello", { client: "node", version: 1 });
  assert.equal(result.server, "fedstream");
  assert.equal(result.version, 1);
  assert.equal(result.max_frame_bytes, 67108864);
  const refused = await c.request("hello", { client: "node", version: 2 });
  assert.equal(refused.type, "error");
  assert.equal(refused.code, "invalid");
  assert.equal(refused.details.argument, "version");
});

const schema = {
  name: `${tag}_people`,
  fields: [
    { name: "name", type: "varchar", size: 8 },
    { name: "id", type: "int" },
    { name: "score", type: "float", nullable: true },
    { name: "seen", type: "timestamp", nullable: true },
  ],
};

test("create_schema and create_stream: identical again is ok, different is already_exists", async () => {
  const made = await c.ok("create_schema", { schema });
  assert.equal(made.schema, schema.name);
  assert.deepEqual(await c.ok("create_schema", { schema }), made);
  const other = await c.request("create_schema", { schema: { ...schema, fields: schema.fields.slice(1) } });
  assert.equal(other.code, "already_exists");
  const xml = `<schema name="${tag}_x"><field name="a" type="bigint"/><field name="b" type="text" nullable="true"/></schema>`;
  assert.equal((await c.ok("create_schema", { schema: xml })).schema, `${tag}_x`);
  const stream = await c.ok("create_stream", { name: `${tag}_s`, schema: schema.name });
  assert.equal(stream.stream, `${tag}_s`);
  assert.equal((await c.ok("create_stream", { name: `${tag}_s`, schema: schema.name })).stream, `${tag}_s`);
  const clash = await c.request("create_stream", { name: `${tag}_s`, schema: `${tag}_x` });
  assert.equal(clash.code, "already_exists");
});

test("lookup: kind, name and the schema with its nullable fields", async () => {
  const found = await c.ok("lookup", { name: `${tag}_s` });
  assert.equal(found.kind, "stream");
  assert.equal(found.name, `${tag}_s`);
  assert.equal(found.schema.name, schema.name);
  assert.deepEqual(found.schema.fields.map((f) => [f.name, f.type, f.nullable ?? false]), [
    ["name", "string", false], ["id", "int", false], ["score", "double", true], ["seen", "timestamp", true],
  ]);
  const missing = await c.request("lookup", { name: `${tag}_nothing` });
  assert.equal(missing.code, "not_found");
});

test("subscribe, push (pipelined), batches with nil, duplicates, timestamps beyond 2^53", async () => {
  const sub = await c.ok("subscribe", { stream: `${tag}_s`, start: "latest", credit: 2 });
  assert.equal(sub.stream, `${tag}_s`);
  const big = 2n ** 60n + 7n; // microseconds: far beyond what a JS number holds exactly
  const pushes = [
    c.request("push", { stream: `${tag}_s`, rows: [{ name: "ann", id: 1, score: null, seen: null }] }),
    c.request("push", { stream: `${tag}_s`, columns: { name: ["bob", "cy"], id: [2.0, 3], score: [1, 2.5], seen: [big, 5] } }),
    c.request("push", { stream: `${tag}_s`, rows: [{ name: "dee", id: 4, score: 0.5, seen: 1 }], producer: tag, seq: 1 }),
  ];
  const replies = await Promise.all(pushes);
  replies.forEach((r) => assert.equal(r.type, "ok", JSON.stringify(r)));
  // Pipelined pushes are served concurrently: each gets its own offset, in no promised order.
  const offsets = replies.map((r) => r.result.offset);
  assert.deepEqual([...offsets].sort(), [0, 1, 2]);
  assert.deepEqual(replies.map((r) => r.result.duplicate), [false, false, false]);
  const again = await c.ok("push", { stream: `${tag}_s`, rows: [{ name: "dee", id: 4, score: 0.5, seen: 1 }], producer: tag, seq: 1 });
  assert.equal(again.duplicate, true);
  assert.equal(again.offset, null);

  const frames = c.subs.get(sub.subscription);
  await c.until(() => frames.length >= 2, "two batches (the credit)");
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(frames.length, 2, "no batch beyond the credit");
  c.sendFrame({ type: "credit", subscription: sub.subscription, batches: 8 });
  await c.until(() => frames.length >= 3, "the third batch after more credit");
  assert.deepEqual(frames.map((f) => f.offset), [0, 1, 2], "batches in log order");
  const byOffset = (i) => frames.find((f) => f.offset === offsets[i]).columns;
  assert.deepEqual(byOffset(0), { name: ["ann"], id: [1], score: [null], seen: [null] });
  assert.deepEqual(byOffset(1).seen, [big, 5]);
  assert.deepEqual(byOffset(1).id, [2, 3]);
  assert.deepEqual(byOffset(2).name, ["dee"]);
  assert.ok(frames.every((f) => f.type === "batch" && f.stream === `${tag}_s`));

  assert.deepEqual(await c.ok("unsubscribe", { subscription: sub.subscription }), { subscription: sub.subscription });
});

test("invalid_tuple names the stream, the field and the tuple; nothing is kept", async () => {
  const before = (await c.ok("lookup", { name: `${tag}_s` })).latest_offset;
  const bad = await c.request("push", { stream: `${tag}_s`, rows: [
    { name: "ok", id: 5, score: null, seen: null },
    { name: "bad", id: null, score: 1, seen: 1 },
  ] });
  assert.equal(bad.type, "error");
  assert.equal(bad.code, "invalid_tuple");
  assert.deepEqual(bad.details, { stream: `${tag}_s`, field: "id", tuple: 1 });
  const long = await c.request("push", { stream: `${tag}_s`, columns: { name: ["123456789"], id: [1], score: [null], seen: [null] } });
  assert.deepEqual(long.details, { stream: `${tag}_s`, field: "name", tuple: 0 });
  const frac = await c.request("push", { stream: `${tag}_s`, columns: { name: ["x"], id: [1.5], score: [null], seen: [null] } });
  assert.equal(frac.code, "invalid_tuple");
  assert.equal((await c.ok("lookup", { name: `${tag}_s` })).latest_offset, before);
});

test("create_sql: the peer compiles a script; a refused one names line and column, creates nothing", async () => {
  const script = `CREATE STREAM ${tag}_bids (auction BIGINT NOT NULL, t TIMESTAMP(3) NOT NULL);
CREATE QUERY ${tag}_big AS INSERT INTO ${tag}_big_out SELECT id, name FROM ${tag}_s WHERE id > 1;
`;
  const made = await c.createQuery(script);
  assert.deepEqual(made, { streams: [`${tag}_bids`], queries: [`${tag}_big`], started: false, warnings: [] });
  const query = await c.ok("lookup", { name: `${tag}_big` });
  assert.equal(query.kind, "query");
  assert.deepEqual(query.definition.boxes.map((b) => [b.type, b.inputs]), [["filter", [`${tag}_s`]], ["map", [query.definition.boxes[0].outputs[0]]]]);
  assert.deepEqual(query.definition.boxes.at(-1).outputs, [`${tag}_big_out`]);
  assert.equal((await c.ok("lookup", { name: `${tag}_bids` })).kind, "stream");
  const unbounded = `CREATE STREAM ${tag}_fresh (a BIGINT NOT NULL, t TIMESTAMP(3) NOT NULL);
INSERT INTO ${tag}_counted SELECT a, COUNT(*) AS n FROM ${tag}_fresh GROUP BY a;`;
  const refused = await c.request("create_sql", { sql: unbounded, name: `${tag}_counting` });
  assert.equal(refused.type, "error");
  assert.equal(refused.code, "invalid_sql");
  assert.deepEqual([refused.details.line, refused.details.column], [2, 58 + 2 * tag.length]);
  for (const name of [`${tag}_fresh`, `${tag}_counting`]) {
    assert.equal((await c.request("lookup", { name })).code, "not_found");
  }
  const noText = await c.request("create_sql", { sql: 42 });
  assert.equal(noText.code, "invalid");
  assert.equal(noText.details.argument, "sql");
});

test("protocol errors: unknown op, missing id, malformed credit naming its subscription", async () => {
  const unknown = await c.request("frobnicate");
  assert.equal(unknown.code, "invalid");
  assert.equal(unknown.details.op, "frobnicate");
  const seen = c.notices.length;
  c.sendFrame({ type: "status" });
  c.sendFrame({ type: "credit", subscription: 77, batches: 0 });
  await c.until(() => c.notices.length >= seen + 2, "two error frames with id nil");
  const [noId, credit] = c.notices.slice(seen);
  assert.equal(noId.code, "invalid");
  assert.equal(credit.code, "invalid");
  assert.equal(credit.details.subscription, 77);
  assert.equal(credit.subscription, undefined, "the subscription field is for ended subscriptions");
  const status = await c.ok("status");
  assert.equal(typeof status.peer, "string");
  assert.ok(status.streams.some((s) => s.name === `${tag}_s` && typeof s.latest_offset === "number"));
});
