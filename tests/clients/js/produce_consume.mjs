// Produce with N idempotent producers, then consume the topic from the start, with one real
// JavaScript Kafka client; for tests/integration/broker/test_js_clients.py.
//
// Usage: node produce_consume.mjs <spec.json>
//   spec: {"client": "platformatic" | "kafkajs", "bootstrap": "127.0.0.1:9092",
//          "topic": "t", "partition": 0, "expect": 20,
//          "producers": [[{"key": hex|null, "value": hex, "headers": [[name, hex]]}, ...], ...],
//          "security": {"ca": path, "cert": path, "key": path,           (optional, kafkajs:
//                       "sasl": {"mechanism": "plain" | "scram-sha-512",  TLS, mTLS, SASL)
//                                "username": u, "password": p}}}
// Prints one JSON line: {"acked": [[first offset of each send, count], ...],
//                        "consumed": [{"offset", "key", "value", "headers"}, ...],
//                        "fetchVersion": <the Fetch version the consumer used, or null>}
// Keys, values and header values travel as hex so that they compare byte for byte.
// Exits non-zero (with the error on stderr) when anything fails or times out.
import { readFileSync } from 'node:fs'

const spec = JSON.parse(readFileSync(process.argv[2], 'utf8'))
const hex = (b) => (b === null || b === undefined ? null : Buffer.from(b).toString('hex'))
const buf = (h) => (h === null ? null : Buffer.from(h, 'hex'))
const deadline = Date.now() + (spec.timeoutMs ?? 60_000)

function symbolOf (object, description) {
  for (let o = object; o; o = Object.getPrototypeOf(o)) {
    const found = Object.getOwnPropertySymbols(o).find((s) => s.description === description)
    if (found) return found
  }
  throw new Error(`no ${description} on the client`)
}

async function platformatic () {
  const { Producer, Consumer } = await import('@platformatic/kafka')
  const acked = []
  for (const [i, records] of spec.producers.entries()) {
    const producer = new Producer({
      clientId: `loglake-js-${i}`,
      bootstrapBrokers: [spec.bootstrap],
      idempotent: true,
      acks: -1,
      autocreateTopics: false
    })
    try {
      const result = await producer.send({
        messages: records.map((r) => ({
          topic: spec.topic,
          partition: spec.partition,
          key: buf(r.key) ?? undefined,
          value: buf(r.value),
          headers: new Map(r.headers.map(([k, v]) => [Buffer.from(k), buf(v)]))
        }))
      })
      acked.push([Number(result.offsets[0].offset), records.length])
    } finally {
      await producer.close()
    }
  }
  const consumer = new Consumer({
    groupId: `loglake-js-${spec.topic}`,
    clientId: 'loglake-js-consumer',
    bootstrapBrokers: [spec.bootstrap],
    maxWaitTime: 500
  })
  let fetchVersion = null
  const consumed = []
  try {
    const stream = await consumer.consume({
      topics: [spec.topic],
      mode: 'earliest',
      autocommit: false
    })
    for await (const m of stream) {
      consumed.push({
        offset: Number(m.offset),
        key: hex(m.key?.length ? m.key : (m.key ?? null)),
        value: hex(m.value),
        headers: [...m.headers.entries()].map(([k, v]) => [Buffer.from(k).toString(), hex(v)])
      })
      if (consumed.length >= spec.expect || Date.now() > deadline) break
    }
    await stream.close()
    // The Fetch version the consumer chose from the broker's ApiVersions (the client's own
    // choice, through its internal getApi: the highest version both sides implement).
    const getApi = symbolOf(consumer, 'plt.kafka.base.getApi')
    consumer[getApi]('Fetch', (error, api) => { if (!error) fetchVersion = api.version })
  } finally {
    await consumer.close(true)
  }
  return { acked, consumed, fetchVersion }
}

// kafkajs's ssl and sasl options from spec.security (TLS with the test CA, a client
// certificate for mTLS, a SASL login); none: plaintext.
function kafkajsSecurity () {
  const sec = spec.security
  if (!sec) return {}
  const out = {
    ssl: {
      ca: [readFileSync(sec.ca, 'utf8')],
      ...(sec.cert ? { cert: readFileSync(sec.cert, 'utf8'), key: readFileSync(sec.key, 'utf8') } : {}),
      rejectUnauthorized: true
    }
  }
  if (sec.sasl) out.sasl = sec.sasl
  return out
}

async function kafkajs () {
  const { Kafka, logLevel } = await import('kafkajs')
  const kafka = new Kafka({ clientId: 'loglake-kafkajs', brokers: [spec.bootstrap], logLevel: logLevel.ERROR, ...kafkajsSecurity() })
  const acked = []
  for (const records of spec.producers) {
    const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, allowAutoTopicCreation: false })
    await producer.connect()
    try {
      const res = await producer.send({
        topic: spec.topic,
        acks: -1,
        messages: records.map((r) => ({
          partition: spec.partition,
          key: buf(r.key),
          value: buf(r.value),
          headers: Object.fromEntries(r.headers.map(([k, v]) => [k, buf(v)]))
        }))
      })
      acked.push([Number(res[0].baseOffset), records.length])
    } finally {
      await producer.disconnect()
    }
  }
  const consumer = kafka.consumer({ groupId: `loglake-kafkajs-${spec.topic}`, maxWaitTimeInMs: 500 })
  const consumed = []
  await consumer.connect()
  try {
    await consumer.subscribe({ topic: spec.topic, fromBeginning: true })
    await new Promise((resolve, reject) => {
      const timer = setInterval(() => {
        if (consumed.length >= spec.expect) { clearInterval(timer); resolve() }
        if (Date.now() > deadline) { clearInterval(timer); reject(new Error(`timed out after ${consumed.length} records`)) }
      }, 50)
      consumer.run({
        autoCommit: false,
        eachMessage: async ({ message }) => {
          consumed.push({
            offset: Number(message.offset),
            key: hex(message.key),
            value: hex(message.value),
            headers: Object.entries(message.headers ?? {}).map(([k, v]) => [k, hex(v)])
          })
        }
      }).catch(reject)
    })
  } finally {
    await consumer.disconnect()
  }
  return { acked, consumed, fetchVersion: null }
}

const run = spec.client === 'kafkajs' ? kafkajs : platformatic
run().then(
  (out) => { process.stdout.write(JSON.stringify(out) + '\n'); process.exit(0) },
  (err) => { process.stderr.write(`${err?.stack ?? err}\n${JSON.stringify(err?.errors ?? [], (k, v) => (typeof v === "bigint" ? String(v) : v), 1)}\n`); process.exit(1) }
)
