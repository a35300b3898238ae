// An Echelon client written from protos/ alone, as a user of another language would:
// @grpc/proto-loader reads the .proto files at run time, no SDK, no generated Python.
// It runs one scenario given as JSON on the command line and prints one JSON line.
//
//   node client.mjs '{"scenario": "roundtrip", "protos": "...", ...}'
//
// Attributes arrive already as protobuf Values ({"High": {"float_value": 45.5}}): JavaScript
// has one number type, and the schema tells int from float.
//
// Scenarios (tests/interop/test_node_client.py drives them):
//   roundtrip    subscribe with a filter on one agent, publish one event per request at
//                DELIVERED on another, ack each delivery by id with one credit back;
//                prints the acks and the `n` of every delivery received.
//   bad-filter   open a subscription whose filter does not parse; prints how it ended.
//   bad-publish  publish events the topic refuses; prints each ack's code.
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";
import path from "node:path";

const spec = JSON.parse(process.argv[2]);
const definition = protoLoader.loadSync(path.join(spec.protos, "echelon/v1/pubsub.proto"), {
  includeDirs: [spec.protos], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
});
const v1 = grpc.loadPackageDefinition(definition).echelon.v1;

const stub = (address) => new v1.PubSub(address, grpc.credentials.createInsecure());
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A subscription stream: every Delivery is one delivery (batching is opt-in and this client
// never asks); each is acked by id with one credit back, so a missed one would stall it.
function subscribe(address, topic, filter, credits) {
  const call = stub(address).Subscribe();
  const state = { received: [], batched: 0, inband: null, status: null, last: Date.now() };
  state.opened = new Promise((resolve) => call.on("metadata", resolve));
  state.ended = new Promise((resolve) => {
    call.on("error", (e) => { state.status = { code: e.code, details: e.details }; resolve(); });
    call.on("end", resolve);
  });
  call.on("data", (d) => {
    state.last = Date.now();
    if (d.code) { state.inband = { code: d.code, error: d.error }; return; }  // the final status, in band
    if (d.batch.length) state.batched += 1;
    state.received.push(Number(d.event.attributes.n.int_value));
    call.write({ ack: { delivery_ids: [d.delivery_id], credits: 1 } });
  });
  call.write({ open: { topic, filter_text: filter, credits } });
  state.call = call;
  return state;
}

// One event per PublishRequest, all written before the acks are read (many in flight).
function publish(address, topic, events, level) {
  const call = stub(address).Publish();
  const acks = [];
  const done = new Promise((resolve, reject) => {
    call.on("data", (a) => {
      for (const one of a.acks.length ? a.acks : [a]) {
        acks.push([Number(one.sequence), one.code, one.destinations, one.error]);
      }
      if (acks.length === events.length) call.end();
    });
    call.on("error", reject);
    call.on("end", () => resolve(acks));
  });
  events.forEach((attrs, i) => call.write({
    topic, attributes: attrs, producer_id: "node", sequence: i + 1, ack_level: level,
  }));
  return done;
}

async function roundtrip() {
  const sub = subscribe(spec.subscribe_agent, spec.topic, spec.filter, spec.credits);
  await sub.opened;
  const acks = await publish(spec.publish_agent, spec.topic, spec.events, "ACK_LEVEL_DELIVERED");
  // DELIVERED means every destination agent holds the event: wait for the stream to go quiet.
  while (Date.now() - sub.last < spec.idle_ms) await sleep(50);
  sub.call.cancel();
  return { acks, received: sub.received, batched: sub.batched };
}

async function badFilter() {
  const sub = subscribe(spec.subscribe_agent, spec.topic, spec.filter, 8);
  await Promise.race([sub.ended, sleep(10000)]);
  return { status: sub.status, inband: sub.inband };
}

async function badPublish() {
  return { acks: await publish(spec.publish_agent, spec.topic, spec.events, "ACK_LEVEL_ACCEPTED") };
}

const scenarios = { roundtrip, "bad-filter": badFilter, "bad-publish": badPublish };
const result = await scenarios[spec.scenario]();
process.stdout.write(JSON.stringify(result) + "\n");
process.exit(0);
