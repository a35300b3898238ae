// A publisher written from protos/ alone, as a Node user of Echelon writes it: @grpc/grpc-js
// with @grpc/proto-loader reading protos/echelon/v1/pubsub.proto at start (no generated code,
// nothing of the Python SDK). One Publish stream, one event per PublishRequest, up to
// --window events in flight (loadtest/node/README.md).
//
//   node publish.js --address HOST:PORT --count N [--window W] [--level 2] [--coalesce]
//     publishes N events, waits for every ack, prints one JSON line: requests, wall, cpu.
//   node publish.js --address HOST:PORT --stdin --pool FILE [--level 2] [--coalesce]
//     the benchmark's driver (loadtest/bench_events/node.py): each stdin line
//     `TAG ID:POOL ID:POOL ...` publishes those events (attributes: entry POOL of the JSON
//     list in FILE, typed Values; payload: ID and the send time, as workload.PAYLOAD), and
//     `TAG ok` or `TAG error ...` is written once the last of them is acked.
'use strict';

const path = require('path');
const fs = require('fs');
const readline = require('readline');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTOS = path.resolve(__dirname, '..', '..', 'protos');

function args(argv) {
  const out = {window: 4096, level: 2, coalesce: false, stdin: false, count: 0, topic: 't', pool: ''};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--coalesce') out.coalesce = true;
    else if (a === '--stdin') out.stdin = true;
    else if (a.startsWith('--')) {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${a} needs a value`);
      const k = a.slice(2);
      out[k] = ['window', 'level', 'count'].includes(k) ? Number(v) : v;
    } else throw new Error(`unknown argument ${a}`);
  }
  if (!out.address) throw new Error('--address is required');
  return out;
}

function client(address) {
  const def = protoLoader.loadSync('echelon/v1/pubsub.proto', {
    includeDirs: [PROTOS], keepCase: true, longs: Number, enums: Number, defaults: false, oneofs: true,
  });
  const v1 = grpc.loadPackageDefinition(def).echelon.v1;
  return new v1.PubSub(address, grpc.credentials.createInsecure());
}

// One stream: requests written in order, acks read in order (one per request, or several in
// `acks` with coalesce_acks). `onAcked(sequence, errors)` after each ack message: every request
// up to that sequence is answered (acks come in request order).
class Publisher {
  constructor(opts, onAcked, onEnd) {
    this.opts = opts;
    this.producer = `node-${process.pid}-${Date.now()}`;
    this.seq = 0;
    this.stub = client(opts.address);
    this.call = this.stub.Publish();
    this.call.on('data', (ack) => {
      const list = ack.acks && ack.acks.length ? ack.acks : [ack];
      // [sequence, what]: a refused event (or the stream's end, in band: every sequence).
      const errors = [];
      if (ack.stream_status) errors.push([Infinity, `stream: ${ack.code} ${ack.error}`]);
      else for (const a of list) if (a.code) errors.push([Number(a.sequence), `${a.sequence}: ${a.code} ${a.error}`]);
      onAcked(ack.stream_status ? 0 : Number(list[list.length - 1].sequence), errors);
    });
    this.call.on('error', (e) => onEnd(e));
    this.call.on('end', () => onEnd(null));
  }

  // False when the stream's buffer is full: wait for 'drain' before the next write.
  write(topic, attributes, payload) {
    this.seq += 1;
    return this.call.write({
      topic, attributes, payload, producer_id: this.producer, sequence: this.seq,
      ack_level: this.opts.level, coalesce_acks: this.opts.coalesce,
    });
  }

  close() {
    this.call.end();
    this.stub.close();
  }
}

function payload(id, sentNs) {
  const b = Buffer.allocUnsafe(16);
  b.writeBigInt64LE(BigInt(id), 0);
  b.writeBigInt64LE(sentNs, 8);
  return b;
}

// --count: N events with the same attributes, --window in flight; the figures on stdout.
function counted(opts) {
  const attrs = {Symbol: {string_value: 'aapl'}, Price: {float_value: 50.0}};
  const body = Buffer.alloc(16);
  let written = 0, acked = 0, errors = 0, draining = false;
  let t0, c0;
  const pub = new Publisher(opts, (seq, errs) => {
    acked = Math.max(acked, seq);
    errors += errs.length;
    if (errs.length && errors <= 5) console.error(errs.map((e) => e[1]).join('\n'));
    if (acked >= opts.count) finish();
    else pump();
  }, (e) => {
    if (acked < opts.count) {
      console.error(`stream ended after ${acked} acks: ${e ? e.message : 'end'}`);
      process.exit(1);
    }
  });
  function pump() {
    while (!draining && written < opts.count && written - acked < opts.window) {
      written += 1;
      if (!pub.write(opts.topic, attrs, body)) {
        draining = true;
        pub.call.once('drain', () => { draining = false; pump(); });
      }
    }
  }
  function finish() {
    const wall = Number(process.hrtime.bigint() - t0) / 1e9;
    const c = process.cpuUsage(c0);
    console.log(JSON.stringify({requests: opts.count, acked, errors, wall, cpu: (c.user + c.system) / 1e6}));
    pub.close();
    process.exit(errors ? 1 : 0);
  }
  t0 = process.hrtime.bigint();
  c0 = process.cpuUsage();
  pump();
}

// --stdin: the benchmark's batches; the events' ids and pool entries come from Python, the
// requests, their payloads' send times and the acks are this process's.
function driven(opts) {
  const pool = JSON.parse(fs.readFileSync(opts.pool, 'utf8'));
  const waiting = [];  // [last sequence of a batch, its tag, errors]
  const todo = [];  // [tag, [[id, pool], ...]] not yet written (the stream's buffer was full)
  let acked = 0, draining = false, ended = false;
  const pub = new Publisher(opts, (seq, errs) => {
    acked = Math.max(acked, seq);
    for (const [seq, what] of errs) {  // to the send holding that sequence
      const w = waiting.find((b) => b[0] >= seq) || waiting[waiting.length - 1];
      if (w) w[2].push(what);
    }
    while (waiting.length && waiting[0][0] <= acked) {
      const [, tag, e] = waiting.shift();
      process.stdout.write(e.length ? `${tag} error ${e.slice(0, 3).join('; ')}\n` : `${tag} ok\n`);
    }
  }, (e) => {
    for (const [, tag] of waiting) process.stdout.write(`${tag} error stream ended: ${e ? e.message : 'end'}\n`);
    waiting.length = 0;
    if (ended) process.exit(0);
  });
  function pump() {
    while (!draining && todo.length) {
      const [tag, events] = todo[0];
      while (events.length) {
        const [id, k] = events.shift();
        if (!pub.write(opts.topic, pool[k], payload(id, process.hrtime.bigint()))) {
          draining = true;
          pub.call.once('drain', () => { draining = false; pump(); });
          if (events.length) return;
        }
      }
      todo.shift();
      waiting.push([pub.seq, tag, []]);
      if (draining) return;
    }
  }
  // `ready` once the channel is connected: a send's clock starts at its write, and writes
  // made while connecting would wait in grpc-js's buffer.
  pub.stub.waitForReady(Date.now() + 30000, (e) => {
    if (e) {
      console.error(`not connected: ${e.message}`);
      process.exit(1);
    }
    process.stdout.write('ready\n');
  });
  const lines = readline.createInterface({input: process.stdin});
  lines.on('line', (line) => {
    const parts = line.trim().split(' ');
    if (!parts[0]) return;
    todo.push([parts[0], parts.slice(1).map((p) => p.split(':').map(Number))]);
    pump();
  });
  lines.on('close', () => {
    ended = true;
    pub.close();
    if (!waiting.length) process.exit(0);
  });
}

const opts = args(process.argv.slice(2));
if (opts.stdin) driven(opts);
else if (opts.count > 0) counted(opts);
else throw new Error('one of --count N or --stdin');
