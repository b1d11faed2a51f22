// Volume scenarios for the official JS client (e2b on npm): control, content API and mounts.
// Run as `node js.cjs <scenario> <workdir>` with NODE_PATH at the pinned clients' node_modules,
// so only the official packages resolve, and with only E2B_API_KEY, E2B_DOMAIN, SSL_CERT_FILE and
// NODE_EXTRA_CA_CERTS set (plus SECOND_API_KEY, another owner's key). Each scenario makes its own
// volumes and sandboxes, removes them in `finally` and prints one JSON object; the scenario names
// and result keys are the same as in py_sync.py, and a refusal is recorded the same way: the
// error's class and message.
'use strict'

const crypto = require('node:crypto')
const { Sandbox, Volume } = require('e2b')

// Each path's "uid:gid mode" as the sandbox sees it. Not coreutils' stat: in gVisor its statx call
// answers EINVAL, on any file.
const OWNERS =
  "python3 -c 'import os, sys; " +
  '[print(f"{s.st_uid}:{s.st_gid} {s.st_mode & 0o7777:o}") for s in map(os.stat, sys.argv[1:])]\''
const MISSING_ID = 'vol' + '0'.repeat(17) // well formed, never issued
const BIG = 100 * 1024 * 1024 // the large file's size: 100 MiB
const CHUNK = 1 << 20
// What is at /mnt/v in a sandbox: the names in it, or "absent".
const LISTING =
  'python3 -c \'import os; p = "/mnt/v"; print(sorted(os.listdir(p)) if os.path.isdir(p) else "absent")\''

const scenarios = {}

function trace(name, stage) {
  process.stderr.write(`js:${name}:${stage}\n`)
}

function shown(answer) {
  try {
    return JSON.stringify(answer === undefined ? null : answer)
  } catch {
    return String(answer)
  }
}

// What a call that should be refused did: the error's class and message, or what it answered.
async function refusal(call) {
  try {
    return { error: null, answer: shown(await call()) }
  } catch (err) {
    // Its classes too: newer clients throw subclasses (VolumeNotFoundError is a NotFoundError).
    const kinds = []
    for (let proto = Object.getPrototypeOf(err); proto && proto !== Object.prototype; proto = Object.getPrototypeOf(proto)) {
      kinds.push(proto.constructor.name)
    }
    return { error: err.constructor.name, kinds, message: String(err.message) }
  }
}

function entry(stat) {
  return {
    name: stat.name,
    type: stat.type,
    path: stat.path,
    size: stat.size,
    mode: stat.mode,
    uid: stat.uid,
    gid: stat.gid,
    target: stat.target ?? null,
    times: [stat.atime, stat.mtime, stat.ctime].every((t) => t instanceof Date && !Number.isNaN(t.getTime())),
  }
}

// `size` bytes that differ per seed and per chunk (the same bytes as the Python flavours send).
function* pattern(seed, size) {
  let sent = 0
  while (sent < size) {
    const hash = crypto.createHash('sha256').update(`${seed}:${sent}`).digest()
    const block = Buffer.concat(Array(CHUNK / 32).fill(hash)).subarray(0, size - sent)
    sent += block.length
    yield block
  }
}

// A request body the client streams (it never holds the whole file): the chunks are made as read.
function stream(chunks) {
  return new ReadableStream({
    pull(controller) {
      const next = chunks.next()
      if (next.done) controller.close()
      else controller.enqueue(new Uint8Array(next.value))
    },
  })
}

async function digest(chunks) {
  const hash = crypto.createHash('sha256')
  let size = 0
  for await (const chunk of chunks) {
    hash.update(chunk)
    size += chunk.length
  }
  return [hash.digest('hex'), size]
}

async function text(chunks) {
  const parts = []
  for await (const chunk of chunks) parts.push(Buffer.from(chunk))
  return Buffer.concat(parts).toString()
}

function suiteName(kind) {
  return `conformance-${kind}-${crypto.randomBytes(5).toString('hex')}`
}

async function destroyQuietly(volumeId, opts) {
  try {
    await Volume.destroy(volumeId, opts)
  } catch (err) {
    process.stderr.write(`cleanup of ${volumeId}: ${err}\n`)
  }
}

scenarios['volume/control'] = async () => {
  const second = process.env.SECOND_API_KEY
  const name = suiteName('control')
  const vol = await Volume.create(name)
  let others = null
  try {
    const listed = await Volume.list()
    const info = await Volume.getInfo(vol.volumeId)
    const connected = await Volume.connect(vol.volumeId)
    const result = {
      name: vol.name,
      id: vol.volumeId,
      token: Boolean(vol.token),
      listed: listed.filter((v) => v.volumeId === vol.volumeId).map((v) => v.name),
      listed_has_token: listed.some((v) => 'token' in v),
      info: [info.volumeId === vol.volumeId, info.name, info.token === vol.token],
      connected: [connected.volumeId === vol.volumeId, connected.name, connected.token === vol.token],
      duplicate: await refusal(() => Volume.create(name)),
      missing: await refusal(() => Volume.getInfo(MISSING_ID)),
      empty_name: await refusal(() => Volume.create('')),
      slash_name: await refusal(() => Volume.create('a/b')),
      // Another owner sees none of it, cannot remove it, and may use the same name.
      second_get: await refusal(() => Volume.getInfo(vol.volumeId, { apiKey: second })),
      second_lists: (await Volume.list({ apiKey: second })).some((v) => v.volumeId === vol.volumeId),
      second_destroy: await Volume.destroy(vol.volumeId, { apiKey: second }),
    }
    others = await Volume.create(name, { apiKey: second })
    result.second_same_name = [others.name, others.volumeId !== vol.volumeId, others.token !== vol.token]
    result.first_still = (await Volume.getInfo(vol.volumeId)).name
    result.destroyed = await Volume.destroy(vol.volumeId)
    result.destroyed_again = await Volume.destroy(vol.volumeId)
    result.after = await refusal(() => Volume.getInfo(vol.volumeId))
    result.listed_after = (await Volume.list()).some((v) => v.volumeId === vol.volumeId)
    result.second_kept = (await Volume.getInfo(others.volumeId, { apiKey: second })).name
    return result
  } finally {
    await destroyQuietly(vol.volumeId)
    if (others !== null) await destroyQuietly(others.volumeId, { apiKey: second })
  }
}

scenarios['volume/content'] = async () => {
  const vol = await Volume.create(suiteName('content'))
  try {
    const written = await vol.writeFile('/notes/a.txt', 'hello volume')
    const result = {
      written: entry(written),
      text: await vol.readFile('notes/a.txt'),
      bytes: Array.from(await vol.readFile('/notes/a.txt', { format: 'bytes' })),
      streamed: await text(await vol.readFile('/notes/a.txt', { format: 'stream' })),
      stat: entry(await vol.getInfo('/notes/a.txt')),
      folder: entry(await vol.getInfo('/notes')),
      exists: [await vol.exists('/notes/a.txt'), await vol.exists('/notes/none.txt')],
      owned: entry(await vol.writeFile('/owned.bin', new Uint8Array([0, 255]).buffer, { uid: 0, gid: 0, mode: 0o600 })),
      replaced: entry(await vol.writeFile('/notes/a.txt', 'replaced', { force: true })),
      replaced_text: await vol.readFile('/notes/a.txt'),
      made: entry(await vol.makeDir('/deep/er/est', { force: true, uid: 1234, gid: 2345, mode: 0o700 })),
      made_parent: entry(await vol.getInfo('/deep')),
      made_again: await refusal(() => vol.makeDir('/deep')),
      made_again_forced: entry(await vol.makeDir('/deep', { force: true })),
      made_without_parent: await refusal(() => vol.makeDir('/no/parent')),
    }
    await vol.writeFile('/deep/er/f.txt', 'x')
    result.list = (await vol.list('/')).map((e) => [e.path, e.type]).sort()
    result.list_deep = (await vol.list('/deep', { depth: 3 })).map((e) => e.path).sort()
    result.list_shallow = (await vol.list('/deep', { depth: 1 })).map((e) => e.path).sort()
    result.updated = entry(await vol.updateMetadata('/notes/a.txt', { uid: 0, gid: 1234, mode: 0o640 }))
    result.updated_mode_only = entry(await vol.updateMetadata('/notes/a.txt', { mode: 0o444 }))
    result.read_missing = await refusal(() => vol.readFile('/notes/none.txt'))
    result.stat_missing = await refusal(() => vol.getInfo('/none'))
    result.list_file = await refusal(() => vol.list('/notes/a.txt'))
    result.escape = entry(await vol.writeFile('/../../../escape.txt', 'inside'))
    result.escape_listed = (await vol.list('/')).some((e) => e.path === '/escape.txt')
    await vol.remove('/notes/a.txt')
    await vol.remove('/deep')
    result.removed = [await vol.exists('/notes/a.txt'), await vol.exists('/deep'), await vol.exists('/notes')]
    result.remove_missing = await refusal(() => vol.remove('/deep'))
    const wrong = new Volume(vol.volumeId, vol.name, `not-${vol.token}`)
    result.wrong_token = await refusal(() => wrong.readFile('/owned.bin'))
    return result
  } finally {
    await destroyQuietly(vol.volumeId)
  }
}

scenarios['volume/large-and-concurrent'] = async () => {
  const vol = await Volume.create(suiteName('large'))
  try {
    const [expected, size] = await digest(pattern(1, BIG))
    const started = performance.now()
    const written = await vol.writeFile('/big.bin', stream(pattern(1, BIG)))
    const [got, gotSize] = await digest(await vol.readFile('/big.bin', { format: 'stream' }))
    const result = {
      size: [size, written.size, gotSize],
      same: got === expected,
      seconds: Math.round((performance.now() - started) / 100) / 10,
    }
    // Two clients write at once: one file each, and the same file from both.
    const seeds = [2, 3]
    const want = {}
    for (const seed of seeds) want[seed] = (await digest(pattern(seed, 8 * CHUNK)))[0]
    await Promise.all([
      ...seeds.map((s) => vol.writeFile(`/own-${s}.bin`, stream(pattern(s, 8 * CHUNK)))),
      ...seeds.map((s) => vol.writeFile('/shared.bin', stream(pattern(s, 8 * CHUNK)))),
    ])
    result.own = []
    for (const s of seeds) {
      result.own.push((await digest(await vol.readFile(`/own-${s}.bin`, { format: 'stream' })))[0] === want[s])
    }
    const [shared] = await digest(await vol.readFile('/shared.bin', { format: 'stream' }))
    result.shared_whole = Object.values(want).includes(shared)
    result.leftovers = (await vol.list('/')).map((e) => e.name).sort()
    return result
  } finally {
    await destroyQuietly(vol.volumeId)
  }
}

async function sh(sbx, command, user = 'user') {
  return (await sbx.commands.run(command, { user })).stdout.trim()
}

scenarios['volume/mounts'] = async () => {
  const vol = await Volume.create(suiteName('mounts'))
  const sandboxes = []
  try {
    await vol.writeFile('/from-api.txt', 'written through the API')
    const first = await Sandbox.create({ volumeMounts: { '/mnt/shared': vol }, timeoutMs: 120_000 })
    sandboxes.push(first)
    const second = await Sandbox.create({ volumeMounts: { '/data': vol.name }, timeoutMs: 120_000 })
    sandboxes.push(second)
    const listed = await Sandbox.list().nextItems()
    const result = {
      mounts: (await first.getInfo()).volumeMounts,
      listed_mounts: listed.filter((item) => item.sandboxId === second.sandboxId).map((item) => item.volumeMounts),
      api_file: await sh(first, 'cat /mnt/shared/from-api.txt'),
      api_owner: await sh(first, `${OWNERS} /mnt/shared/from-api.txt`),
      root_owner: await sh(first, `${OWNERS} /mnt/shared`),
      whoami: await sh(first, 'id -u; id -g'),
    }
    await sh(first, 'echo from-first > /mnt/shared/first.txt && mkdir -p /mnt/shared/dir')
    await sh(second, 'echo from-root > /data/root.txt', 'root')
    result.second_sees = await sh(second, 'cat /data/first.txt')
    result.first_sees = await sh(first, 'cat /mnt/shared/root.txt')
    result.sandbox_owner = (await sh(second, `${OWNERS} /data/first.txt /data/dir /data/root.txt`))
      .split('\n')
      .map((line) => line.split(' ')[0])
    result.api_sees = [await vol.readFile('/first.txt'), (await vol.getInfo('/first.txt')).uid]
    result.root_file_uid = (await vol.getInfo('/root.txt')).uid
    result.in_use = await refusal(() => Volume.destroy(vol.volumeId))
    await second.kill()
    await first.pause()
    result.in_use_paused = await refusal(() => Volume.destroy(vol.volumeId))
    await vol.writeFile('/while-paused.txt', 'kept')
    const resumed = await Sandbox.connect(first.sandboxId, { timeoutMs: 120_000 })
    sandboxes.push(resumed)
    result.resumed_sees = (await sh(resumed, 'cat /mnt/shared/while-paused.txt /mnt/shared/first.txt')).split(/\s+/)
    result.unknown_volume = await refusal(async () => {
      sandboxes.push(await Sandbox.create({ volumeMounts: { '/x': suiteName('none') }, timeoutMs: 60_000 }))
    })
    await resumed.kill()
    result.destroyed = await Volume.destroy(vol.volumeId)
    return result
  } finally {
    for (const sbx of sandboxes) {
      try {
        await sbx.kill()
      } catch (err) {
        process.stderr.write(`cleanup of ${sbx.sandboxId}: ${err}\n`)
      }
    }
    await destroyQuietly(vol.volumeId)
  }
}

// A filesystem-only pause keeps the mount; a snapshot holds the sandbox's own files, not the volume's.
scenarios['volume/snapshots'] = async () => {
  const vol = await Volume.create(suiteName('snapshots'))
  const sandboxes = []
  let snapshotId = null
  const createKept = async (...args) => {
    const sbx = await Sandbox.create(...args)
    sandboxes.push(sbx)
    return sbx
  }
  try {
    const source = await createKept({ volumeMounts: { '/mnt/v': vol }, timeoutMs: 120_000 })
    await sh(source, 'echo in-volume > /mnt/v/shared.txt && echo own > /home/user/own.txt')
    await source.pause({ keepMemory: false })
    const result = { in_use_cold_paused: await refusal(() => Volume.destroy(vol.volumeId)) }
    await vol.writeFile('/while-paused.txt', 'kept')
    const resumed = await Sandbox.connect(source.sandboxId, { timeoutMs: 120_000 })
    sandboxes.push(resumed)
    result.cold_resumed_sees = (
      await sh(resumed, 'cat /mnt/v/while-paused.txt /mnt/v/shared.txt /home/user/own.txt')
    ).split(/\s+/)
    result.cold_resumed_mounts = (await resumed.getInfo()).volumeMounts.map((m) => m.path)
    snapshotId = (await resumed.createSnapshot()).snapshotId
    await vol.writeFile('/after-snapshot.txt', 'later')
    const plain = await createKept(snapshotId, { timeoutMs: 120_000 })
    result.plain_sees = [await sh(plain, 'cat /home/user/own.txt'), await sh(plain, LISTING)]
    result.plain_mounts = (await plain.getInfo()).volumeMounts
    const again = await createKept(snapshotId, { volumeMounts: { '/mnt/v': vol.name }, timeoutMs: 120_000 })
    result.again_sees = (await sh(again, 'cat /home/user/own.txt /mnt/v/after-snapshot.txt')).split(/\s+/)
    for (const sbx of [resumed, plain, again]) await sbx.kill()
    // The snapshot is kept, and does not hold the volume.
    result.destroyed = await Volume.destroy(vol.volumeId)
    return result
  } finally {
    for (const sbx of sandboxes) {
      try {
        await sbx.kill()
      } catch (err) {
        process.stderr.write(`cleanup of ${sbx.sandboxId}: ${err}\n`)
      }
    }
    if (snapshotId !== null) await Sandbox.deleteSnapshot(snapshotId)
    await destroyQuietly(vol.volumeId)
  }
}

async function main() {
  const [name, work] = process.argv.slice(2)
  const run = Object.hasOwn(scenarios, name) ? scenarios[name] : undefined
  if (!run) throw new Error(`unknown scenario ${JSON.stringify(name)}; known: ${Object.keys(scenarios).join(', ')}`)
  trace(name, 'start')
  const result = await run(work)
  trace(name, 'done')
  console.log(JSON.stringify(result))
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
