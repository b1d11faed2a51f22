// Control-plane scenarios for the official JS client (e2b on npm) against the reference server.
// Run as `node js.cjs <scenario> <workdir>` with NODE_PATH at the pinned clients' node_modules,
// so only the official packages resolve, and with only E2B_API_KEY, E2B_DOMAIN, SSL_CERT_FILE and
// NODE_EXTRA_CA_CERTS set (plus SECOND_API_KEY, another owner's key, passed explicitly where a
// scenario needs it). Each scenario makes its own sandboxes, kills them in `finally` and prints
// one JSON object; the scenario names and result keys are the same as in py_sync.py.
'use strict'

const crypto = require('node:crypto')
const { Sandbox, NotFoundError, SandboxError, AuthenticationError, Template, BuildError, CommandExitError, Volume, waitForPort } = require('e2b')

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

function trace(name, stage) {
  process.stderr.write(`js:${name}:${stage}\n`)
}

async function waitUntil(check, seconds = 20) {
  const deadline = Date.now() + seconds * 1000
  while (Date.now() < deadline) {
    if (await check()) return true
    await sleep(200)
  }
  return await check()
}

// The name of a not-found error (SandboxNotFoundError or NotFoundError); anything else is rethrown.
function notFoundName(err) {
  if (err instanceof NotFoundError) return err.constructor.name
  throw err
}

// A server on port 8001 that answers with the headers it received, one "name: value" per line;
// scripts run where they are, so the file is read from beside this one.
const HEADER_ECHO = require('node:fs').readFileSync(
  require('node:path').join(__dirname, '..', 'in_sandbox', 'header_echo.py'),
  'utf8',
)

// As in py_sync.py: a background loop (its pid in the tmpfs /tmp), a tmpfs file, a disk file.
const FORK_SETUP = "nohup sh -c 'while :; do sleep 1; done' >/dev/null 2>&1 & echo $! > /tmp/loop.pid; " +
  'echo in-memory > /tmp/ram.txt; echo on-disk > /home/user/disk.txt'
const FORK_ALIVE = 'kill -0 "$(cat /tmp/loop.pid)" && echo ok'
const FORK_CHECK = `${FORK_ALIVE} && cat /tmp/ram.txt /home/user/disk.txt && echo "$E2B_SANDBOX_ID $FORK_ENV"`

// The MCP scenario's stdio server, and git's own settings that make github.com's URL of its
// repository the volume's copy (the sandbox has no route out).
const MCP_ECHO = require('node:fs').readFileSync(
  require('node:path').join(__dirname, '..', 'in_sandbox', 'mcp_echo_server.py'),
  'utf8',
)
const MCP_GIT_ENVS = {
  GIT_CONFIG_COUNT: '1',
  GIT_CONFIG_KEY_0: 'url./mnt/mirror/.insteadOf',
  GIT_CONFIG_VALUE_0: 'https://github.com/',
}
const MCP_MIRROR =
  'cd /tmp/echo && git init -q && git add server.py && git -c user.name=c -c user.email=c@example.com ' +
  'commit -qm echo && mkdir -p /mnt/mirror/example && git clone -q --bare /tmp/echo /mnt/mirror/example/echo.git'
const MCP_CONFIG = { 'github/example/echo': { runCmd: 'python3 server.py', envs: { ECHO_PREFIX: '> ' } } }
const MCP_ACCEPT = { Accept: 'application/json, text/event-stream', 'Content-Type': 'application/json' }

// The JSON-RPC message of a streamable-HTTP answer: a JSON body, or the data of its SSE event.
async function mcpAnswer(response) {
  const text = await response.text()
  if ((response.headers.get('content-type') || '').startsWith('text/event-stream')) {
    const data = text.split(/\r?\n/).filter((line) => line.startsWith('data:')).map((line) => line.slice(5).trim())
    return data.length ? JSON.parse(data[data.length - 1]) : null
  }
  return text ? JSON.parse(text) : null
}

// Whole seconds around a sample between two others, which the window leaves out (null: no such sample yet).
function metricsWindow(stamps) {
  for (let i = 1; i + 1 < stamps.length; i++) {
    const [start, end] = [Math.floor(stamps[i]), Math.ceil(stamps[i])]
    if (stamps[i - 1] < start && stamps[i + 1] > end) return [start, end]
  }
  return null
}

// One Connect streaming envelope: flags 0, the length, the JSON message.
function envelope(message) {
  const payload = Buffer.from(JSON.stringify(message))
  const head = Buffer.alloc(5)
  head.writeUInt32BE(payload.length, 1)
  return Buffer.concat([head, payload])
}

// The status of each process and watch RPC sent to the sandbox's envd without its token, each
// aimed at a live process or folder, so that a request let through would act.
async function rpcStatusesWithoutToken(target, pid, sleeper, terminal) {
  const base = `https://${target.getHost(49983)}`
  const unary = { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' }
  const stream = { 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1' }
  const calls = {
    'process.Process/SendInput': { process: { pid }, input: { stdin: 'eAo=' } },
    'process.Process/CloseStdin': { process: { pid } },
    'process.Process/SendSignal': { process: { pid: sleeper }, signal: 'SIGNAL_SIGKILL' },
    'process.Process/Update': { process: { pid: terminal }, pty: { size: { cols: 90, rows: 20 } } },
    'filesystem.Filesystem/CreateWatcher': { path: '/home/user/watched' },
    'filesystem.Filesystem/GetWatcherEvents': { watcherId: 'no-such-watcher' },
    'filesystem.Filesystem/RemoveWatcher': { watcherId: 'no-such-watcher' },
  }
  const streams = {
    'process.Process/Connect': { process: { pid } },
    'filesystem.Filesystem/WatchDir': { path: '/home/user/watched' },
  }
  const statuses = {}
  for (const [route, body] of Object.entries(calls)) {
    const response = await fetch(`${base}/${route}`, {
      method: 'POST',
      body: JSON.stringify(body),
      headers: unary,
      signal: AbortSignal.timeout(10000),
    })
    await response.arrayBuffer()
    statuses[route.split('/')[1]] = response.status
  }
  for (const [route, body] of Object.entries(streams)) {
    const controller = new AbortController()
    const timer = setTimeout(() => controller.abort(), 10000)
    const response = await fetch(`${base}/${route}`, {
      method: 'POST',
      body: envelope(body),
      headers: stream,
      signal: controller.signal,
    })
    statuses[route.split('/')[1]] = response.status
    controller.abort() // a stream let through would stay open: only its status is wanted
    clearTimeout(timer)
  }
  return statuses
}

const scenarios = {
  'sandbox/create-env-metadata': async () => {
    const sbx = await Sandbox.create({ envs: { FROM_CREATE: 'yes' }, metadata: { case: 'create', n: '1' }, timeoutMs: 120000 })
    try {
      const info = await sbx.getInfo()
      const run = await sbx.commands.run('echo $FROM_CREATE; whoami; pwd')
      return {
        stdout: run.stdout,
        metadata: info.metadata,
        template: info.templateId,
        state: info.state,
        same_id: info.sandboxId === sbx.sandboxId,
        ends_after_start: info.endAt.getTime() > info.startedAt.getTime(),
        lifetime: (info.endAt.getTime() - info.startedAt.getTime()) / 1000,
      }
    } finally {
      await sbx.kill()
    }
  },

  'sandbox/get-host': async () => {
    const sbx = await Sandbox.create({ timeoutMs: 120000 })
    try {
      await sbx.files.write('/home/user/site/index.html', 'hello from inside')
      await sbx.commands.run('cd /home/user/site && python3 -m http.server 8000', { background: true })
      const host = sbx.getHost(8000)
      let body = ''
      const ok = await waitUntil(async () => {
        let response
        try {
          response = await fetch(`https://${host}/index.html`, { signal: AbortSignal.timeout(5000) })
          body = await response.text()
        } catch {
          return false
        }
        return response.status === 200
      })
      return { host, ok, body }
    } finally {
      await sbx.kill()
    }
  },

  // A WebSocket through the edge to a server inside the sandbox (the agent's own Python has the
  // websockets package). undici is the official client's HTTP library; its WebSocket trusts
  // NODE_EXTRA_CA_CERTS like every other Node TLS connection.
  'sandbox/websocket': async () => {
    const { WebSocket } = require('undici')
    const sbx = await Sandbox.create({ timeoutMs: 120000 })
    try {
      const server = [
        'import asyncio',
        'from websockets.asyncio.server import serve',
        'async def echo(ws):',
        '    async for message in ws:',
        '        await ws.send(message)',
        '        if message == "bye":',
        '            await ws.close(4001, "asked to")',
        'async def main():',
        '    async with serve(echo, "0.0.0.0", 8765, subprotocols=["echo.v1"]):',
        '        await asyncio.Future()',
        'asyncio.run(main())',
      ].join('\n')
      await sbx.files.write('/home/user/ws_echo.py', server)
      await sbx.commands.run('/opt/e2b-compat/venv/bin/python /home/user/ws_echo.py', { background: true })
      const url = `wss://${sbx.getHost(8765)}/echo`
      const session = () =>
        new Promise((resolve, reject) => {
          const ws = new WebSocket(url, ['echo.v1'])
          const received = []
          ws.binaryType = 'arraybuffer'
          ws.onerror = (event) => reject(new Error(String(event.message || 'websocket error')))
          ws.onopen = () => {
            ws.send('hello')
            ws.send(new Uint8Array([1, 2, 3]))
            ws.send('bye')
          }
          ws.onmessage = (event) =>
            received.push(typeof event.data === 'string' ? event.data : Array.from(new Uint8Array(event.data)))
          ws.onclose = (event) => resolve({ received, code: event.code, reason: event.reason, protocol: ws.protocol })
        })
      let result
      await waitUntil(async () => {
        try {
          result = await session()
          return true
        } catch {
          return false
        }
      })
      return result ?? { received: [], code: null }
    } finally {
      await sbx.kill()
    }
  },

  // The list's order, startedAfter and template (clients from 2.50), each walked a page of one at a time.
  'sandbox/list-order': async () => {
    const suite = crypto.randomUUID().replace(/-/g, '').slice(0, 12)
    const made = []
    try {
      for (let i = 0; i < 3; i++) {
        made.push(await Sandbox.create({ metadata: { suite, i: String(i) }, timeoutMs: 120000 }))
      }
      const walk = async (order, query = {}) => {
        const paginator = Sandbox.list({ query: { metadata: { suite }, ...query }, limit: 1, ...(order ? { order } : {}) })
        const seen = []
        while (paginator.hasNext) seen.push(...(await paginator.nextItems()).map((item) => item.sandboxId))
        return seen
      }
      const secondStart = (await made[1].getInfo()).startedAt
      return {
        made: made.map((s) => s.sandboxId),
        asc: await walk('asc'),
        desc: await walk('desc'),
        default: await walk(),
        started_after: await walk('asc', { startedAfter: new Date(secondStart) }),
        template: await walk('asc', { template: 'base' }),
        other_template: await walk(undefined, { template: 'no-such-template-e2b' }),
      }
    } finally {
      for (const sbx of made) await sbx.kill()
    }
  },

  // The default user's sudo (a setuid program) in a sandbox of the default template: root through it.
  'sandbox/sudo': async () => {
    const sbx = await Sandbox.create({ timeoutMs: 120000 })
    try {
      const result = await sbx.commands.run('sudo -n id -un && id -un')
      return { stdout: result.stdout, stderr: result.stderr, exit_code: result.exitCode }
    } catch (e) {
      if (!(e instanceof CommandExitError)) throw e
      return { stdout: e.stdout, stderr: e.stderr, exit_code: e.exitCode }
    } finally {
      await sbx.kill()
    }
  },

  // fork({ count: 2 }) (clients from 2.35): each fork goes on with the source's processes, memory and files.
  'sandbox/fork': async () => {
    const suite = crypto.randomUUID().replace(/-/g, '').slice(0, 12)
    const sbx = await Sandbox.create({ metadata: { suite }, envs: { FORK_ENV: 'inherited' }, timeoutMs: 120000 })
    const made = []
    try {
      await sbx.commands.run(FORK_SETUP)
      let forks
      try {
        forks = await sbx.fork({ count: 2 })
      } catch (e) {
        return { raised: e.constructor.name, message: String(e.message) } // a refusal: its message has the status
      }
      const outcome = { raised: null, source: sbx.sandboxId, forks: [] }
      for (const fork of forks) {
        if (!(fork instanceof Sandbox)) {
          outcome.forks.push({ error: `${fork.constructor.name}: ${fork.message}` })
          continue
        }
        made.push(fork)
        const stdout = (await fork.commands.run(FORK_CHECK)).stdout
        outcome.forks.push({ id: fork.sandboxId, stdout, metadata: (await fork.getInfo()).metadata })
      }
      outcome.source_runs = (await sbx.commands.run(FORK_ALIVE)).stdout
      outcome.listed = (await Sandbox.list({ query: { metadata: { suite } } }).nextItems()).length
      return outcome
    } finally {
      for (const fork of made) await fork.kill()
      await sbx.kill()
    }
  },

  'sandbox/mcp': async () => {
    const suite = crypto.randomUUID().replace(/-/g, '').slice(0, 12)
    const vol = await Volume.create(`mcp-${suite}`)
    const made = []
    try {
      const helper = await Sandbox.create({ volumeMounts: { '/mnt/mirror': vol }, timeoutMs: 120000 })
      made.push(helper)
      await helper.files.write('/tmp/echo/server.py', MCP_ECHO, { user: 'root' }) // git as root wants its own files
      await helper.commands.run(MCP_MIRROR, { user: 'root' })
      await helper.kill()
      const sbx = await Sandbox.create({
        mcp: MCP_CONFIG, envs: MCP_GIT_ENVS, volumeMounts: { '/mnt/mirror': vol.name }, timeoutMs: 120000,
      })
      made.push(sbx)
      const url = sbx.getMcpUrl()
      const token = await sbx.getMcpToken()
      const readBack = await (await Sandbox.connect(sbx.sandboxId)).getMcpToken()
      const post = (body, headers) => fetch(url, { method: 'POST', headers, body: JSON.stringify(body) })
      const ping = { jsonrpc: '2.0', id: 0, method: 'ping' }
      const refused = []
      for (const extra of [{}, { Authorization: 'Bearer wrong' }]) {
        const answer = await post(ping, { ...MCP_ACCEPT, ...extra })
        await answer.text()
        refused.push(answer.status)
      }
      let auth = { ...MCP_ACCEPT, Authorization: `Bearer ${token}` }
      const hello = { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'c', version: '1' } }
      const started = await post({ jsonrpc: '2.0', id: 1, method: 'initialize', params: hello }, auth)
      const session = started.headers.get('mcp-session-id')
      const init = await mcpAnswer(started)
      auth = { ...auth, 'Mcp-Protocol-Version': '2025-06-18', ...(session ? { 'Mcp-Session-Id': session } : {}) }
      await (await post({ jsonrpc: '2.0', method: 'notifications/initialized' }, auth)).text()
      const tools = (await mcpAnswer(await post({ jsonrpc: '2.0', id: 2, method: 'tools/list' }, auth))) || {}
      const call = { name: 'echo', arguments: { text: 'hello' } }
      const called = (await mcpAnswer(await post({ jsonrpc: '2.0', id: 3, method: 'tools/call', params: call }, auth))) || {}
      return {
        url,
        host: sbx.getHost(50005),
        token_read_back: token !== undefined && readBack === token,
        refused,
        server: (((init || {}).result || {}).serverInfo || {}).name ?? null,
        session: session !== null,
        tools: ((tools.result || {}).tools || []).map((tool) => tool.name).sort(),
        echo: ((called.result || {}).content || []).map((c) => c.text),
      }
    } finally {
      for (const sandbox of made) await sandbox.kill().catch(() => {})
      await Volume.destroy(vol.volumeId)
    }
  },

  'sandbox/list-filter-paginate': async () => {
    const suite = crypto.randomUUID().replace(/-/g, '').slice(0, 12)
    const made = []
    let decoy = null
    try {
      for (let i = 0; i < 3; i++) {
        made.push(await Sandbox.create({ metadata: { suite, i: String(i) }, timeoutMs: 120000 }))
      }
      // The same owner's sandbox of another suite (sharing i: '0' with the first): the filter leaves it out.
      decoy = await Sandbox.create({ metadata: { suite: `${suite}-decoy`, i: '0' }, timeoutMs: 120000 })
      const paginator = Sandbox.list({ query: { metadata: { suite } }, limit: 2 })
      let pages = 0
      const seen = []
      while (paginator.hasNext) {
        const items = await paginator.nextItems()
        pages += 1
        seen.push(...items.map((item) => item.sandboxId))
      }
      // The same query paged by one, by two and not at all: pages of one show the cursor's order.
      const walks = {}
      for (const [name, limit] of [['1', 1], ['2', 2], ['default', undefined]]) {
        const walk = Sandbox.list({ query: { metadata: { suite } }, ...(limit === undefined ? {} : { limit }) })
        walks[name] = []
        while (walk.hasNext) walks[name].push((await walk.nextItems()).map((item) => item.sandboxId))
      }
      await made[0].pause()
      const paused = await Sandbox.list({ query: { metadata: { suite }, state: ['paused'] } }).nextItems()
      const running = await Sandbox.list({ query: { metadata: { suite }, state: ['running'] } }).nextItems()
      const sameSet = (a, b) => JSON.stringify([...a].sort()) === JSON.stringify([...b].sort())
      return {
        suite,
        made: made.map((s) => s.sandboxId),
        decoy: decoy.sandboxId,
        walks,
        pages,
        all_found: sameSet(seen, made.map((s) => s.sandboxId)),
        paused: JSON.stringify(paused.map((s) => s.sandboxId)) === JSON.stringify([made[0].sandboxId]),
        paused_state: paused.map((s) => s.state),
        running: sameSet(running.map((s) => s.sandboxId), made.slice(1).map((s) => s.sandboxId)),
      }
    } finally {
      for (const sbx of made) await sbx.kill()
      if (decoy !== null) await decoy.kill()
    }
  },

  'sandbox/timeout': async () => {
    const sbx = await Sandbox.create({ timeoutMs: 120000 })
    try {
      await sbx.setTimeout(2000)
      const gone = await waitUntil(async () => !(await sbx.isRunning()), 30)
      let infoError = null
      try {
        await sbx.getInfo()
      } catch (e) {
        infoError = notFoundName(e)
      }
      return { gone, info_error: infoError }
    } finally {
      await sbx.kill()
    }
  },

  'sandbox/pause-memory-connect': async () => {
    const sbx = await Sandbox.create({ timeoutMs: 120000 })
    try {
      const handle = await sbx.commands.run('while true; do date +%s%N > /tmp/tick; sleep 0.1; done', { background: true })
      const first = await sbx.pause()
      const second = await sbx.pause()
      const listed = (await Sandbox.list({ query: { state: ['paused'] } }).nextItems()).map((s) => s.sandboxId)
      const state = (await Sandbox.getInfo(sbx.sandboxId)).state
      const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120000 })
      const pids = (await again.commands.list()).map((p) => p.pid)
      const before = await again.files.read('/tmp/tick')
      const ticking = await waitUntil(async () => (await again.files.read('/tmp/tick')) !== before, 10)
      return {
        first,
        second,
        listed_paused: listed.includes(sbx.sandboxId),
        state,
        process_survived: pids.includes(handle.pid),
        still_ticking: ticking,
        running_after: await again.isRunning(),
      }
    } finally {
      await sbx.kill()
    }
  },

  'sandbox/pause-filesystem-connect': async () => {
    const sbx = await Sandbox.create({ envs: { KEEP: 'env' }, timeoutMs: 120000 })
    try {
      await sbx.files.write('/home/user/kept.txt', 'kept across the pause')
      const handle = await sbx.commands.run('sleep 600', { background: true })
      const paused = await sbx.pause({ keepMemory: false })
      const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120000 })
      return {
        paused,
        file: await again.files.read('/home/user/kept.txt'),
        process_gone: !(await again.commands.list()).some((p) => p.pid === handle.pid),
        env: (await again.commands.run('echo $KEEP')).stdout,
      }
    } finally {
      await sbx.kill()
    }
  },

  'sandbox/connect-reboot': async () => {
    const sbx = await Sandbox.create({ timeoutMs: 120000 })
    try {
      await sbx.files.write('/home/user/kept.txt', 'kept across the reboot')
      const handle = await sbx.commands.run('sleep 600', { background: true })
      await sbx.commands.run('echo in-memory > /dev/shm/mark')
      const paused = await sbx.pause()
      const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120000, onResume: 'reboot' })
      return {
        paused,
        file: await again.files.read('/home/user/kept.txt'),
        process_gone: !(await again.commands.list()).some((p) => p.pid === handle.pid),
        shm: (await again.commands.run('cat /dev/shm/mark 2>/dev/null || echo gone')).stdout,
        running: await again.isRunning(),
      }
    } finally {
      await sbx.kill()
    }
  },

  'sandbox/snapshot-restore': async () => {
    const source = await Sandbox.create({ timeoutMs: 120000 })
    const other = await Sandbox.create({ timeoutMs: 120000 })
    let restored = null
    const taken = []
    try {
      await source.files.write('/home/user/snap.txt', 'snapshot content')
      const snapshot = await source.createSnapshot()
      const snapshotId = snapshot.snapshotId
      taken.push(snapshotId)
      const name = `named-${crypto.randomUUID().replace(/-/g, '').slice(0, 12)}`
      const named = await source.createSnapshot({ name })
      taken.push(named.snapshotId)
      const theirs = await other.createSnapshot() // another sandbox's: the sandbox filter leaves it out
      taken.push(theirs.snapshotId)
      const listedItems = await Sandbox.listSnapshots({ sandboxId: source.sandboxId }).nextItems()
      const listed = listedItems.map((s) => s.snapshotId)
      const listedOther = (await Sandbox.listSnapshots({ sandboxId: other.sandboxId }).nextItems()).map((s) => s.snapshotId)
      // At most five pages: a cursor the server ignores would page forever.
      const pages = []
      const paginator = Sandbox.listSnapshots({ sandboxId: source.sandboxId, limit: 1 })
      while (paginator.hasNext && pages.length < 5) pages.push((await paginator.nextItems()).map((s) => s.snapshotId))
      const sourceRunning = await source.isRunning()
      await source.kill()
      restored = await Sandbox.create(snapshotId, { timeoutMs: 120000 })
      const content = await restored.files.read('/home/user/snap.txt')
      await restored.files.write('/home/user/snap.txt', 'changed')
      let inUse
      try {
        await Sandbox.deleteSnapshot(snapshotId)
        inUse = 'deleted while in use'
      } catch (e) {
        if (!(e instanceof SandboxError)) throw e
        inUse = e.message.slice(0, 3) // the SDK formats API errors as "<status>: <message>"
      }
      await restored.kill()
      return {
        listed: listed.includes(snapshotId),
        names: snapshot.names,
        source_running: sourceRunning,
        content,
        in_use: inUse,
        deleted: await Sandbox.deleteSnapshot(snapshotId),
        deleted_again: await Sandbox.deleteSnapshot(snapshotId),
        name,
        named_names: named.names,
        listed_names: Object.fromEntries(listedItems.map((s) => [s.snapshotId, s.names])),
        source_snapshots: [snapshotId, named.snapshotId],
        other_snapshot: theirs.snapshotId,
        listed_source: listed,
        listed_other: listedOther,
        pages,
      }
    } finally {
      await source.kill()
      await other.kill()
      if (restored !== null) await restored.kill()
      for (const takenId of taken.slice(1)) await Sandbox.deleteSnapshot(takenId)
    }
  },

  'sandbox/metrics': async () => {
    const sbx = await Sandbox.create({ timeoutMs: 120000 })
    try {
      await sbx.commands.run('head -c 20000000 /dev/urandom | sha256sum')
      let metrics = []
      await waitUntil(async () => {
        metrics = await sbx.getMetrics()
        return metricsWindow(metrics.map((m) => m.timestamp.getTime() / 1000)) !== null
      }, 40)
      const first = metrics.length ? metrics[0] : null
      const series = metrics.map((m) => m.timestamp.getTime() / 1000)
      const window = metricsWindow(series) ?? [0, 0] // a window that leaves out the first and last samples
      const [start, end] = window.map((t) => new Date(t * 1000))
      const windowed = (await sbx.getMetrics({ start, end })).map((m) => m.timestamp.getTime() / 1000)
      const started = Math.floor((await sbx.getInfo()).startedAt.getTime() / 1000)
      const before = await sbx.getMetrics({ start: new Date((started - 3600) * 1000), end: new Date((started - 1800) * 1000) })
      return {
        series,
        window,
        windowed,
        before_start: before.length,
        count: metrics.length,
        cpu_count: first ? first.cpuCount : null,
        mem_total: first ? first.memTotal : null,
        mem_used_positive: Boolean(first && first.memUsed > 0),
        // timestamp is a Date built from the API's string; an unparsable one is an Invalid Date
        has_timestamp: Boolean(first && first.timestamp instanceof Date && !Number.isNaN(first.timestamp.getTime())),
      }
    } finally {
      await sbx.kill()
    }
  },

  'sandbox/kill-is-running': async () => {
    const sbx = await Sandbox.create({ timeoutMs: 120000 })
    try {
      const running = await sbx.isRunning()
      const killed = await sbx.kill()
      let connectError = null
      try {
        await Sandbox.connect(sbx.sandboxId)
      } catch (e) {
        connectError = notFoundName(e)
      }
      return {
        running,
        killed,
        running_after: await sbx.isRunning(),
        killed_again: await Sandbox.kill(sbx.sandboxId),
        connect_error: connectError,
      }
    } finally {
      await sbx.kill()
    }
  },

  'sandbox/other-owner': async () => {
    const second = process.env.SECOND_API_KEY
    if (!second) throw new Error('SECOND_API_KEY is not set')
    const sbx = await Sandbox.create({ metadata: { 'owner-test': 'yes' }, timeoutMs: 120000 })
    try {
      const theirs = (await Sandbox.list({ apiKey: second }).nextItems()).map((s) => s.sandboxId)
      let connectError = null
      try {
        await Sandbox.connect(sbx.sandboxId, { apiKey: second })
      } catch (e) {
        connectError = notFoundName(e)
      }
      return {
        listed_for_other: theirs.includes(sbx.sandboxId),
        connect_error: connectError,
        other_kill: await Sandbox.kill(sbx.sandboxId, { apiKey: second }),
        still_running: await sbx.isRunning(),
      }
    } finally {
      await sbx.kill()
    }
  },

  // A burst of creates from two owners at once; each sandbox says who it is through every path.
  'sandbox/parallel-creates': async () => {
    const BURST = 32
    const keys = { first: process.env.E2B_API_KEY, second: process.env.SECOND_API_KEY }
    if (!keys.second) throw new Error('SECOND_API_KEY is not set')
    const identity = 'printf "%s|%s|%s|%s" "$(hostname)" "$E2B_COMPAT_MARKER" "$E2B_SANDBOX_ID" "$(cat /tmp/identity 2>/dev/null)"'
    const made = []
    const one = async (n) => {
      const owner = n % 2 === 0 ? 'first' : 'second'
      const marker = crypto.randomUUID().replaceAll('-', '')
      const sbx = await Sandbox.create({ envs: { E2B_COMPAT_MARKER: marker }, metadata: { marker }, apiKey: keys[owner] })
      made.push(sbx)
      const found = { owner, id: sbx.sandboxId, marker }
      try {
        // A request that reached another sandbox may fail there: that is an answer too.
        await sbx.files.write('/tmp/identity', marker)
        const [hostname, envMarker, envId, fileMarker] = (await sbx.commands.run(identity)).stdout.split('|')
        found.seen = {
          hostname,
          env_marker: envMarker,
          env_id: envId,
          file_marker: fileMarker,
          read_marker: await sbx.files.read('/tmp/identity'),
          metadata_marker: (await sbx.getInfo()).metadata.marker ?? null,
        }
      } catch (e) {
        if (!(e instanceof SandboxError || e instanceof AuthenticationError)) throw e
        found.error = `${e.constructor.name}: ${e.message}`
      }
      return found
    }
    try {
      return { sandboxes: await Promise.all(Array.from({ length: BURST }, (_, n) => one(n))) }
    } finally {
      await Promise.allSettled(made.map((sbx) => sbx.kill()))
    }
  },

  // Network options at create and update: what getInfo reports, and what a server inside sees.
  'sandbox/network-settings': async () => {
    const sbx = await Sandbox.create({
      timeoutMs: 120000,
      allowInternetAccess: false,
      network: {
        allowOut: ['10.91.0.0/16'],
        denyOut: ['10.92.0.0/16'],
        allowPublicTraffic: false,
        maskRequestHost: '${PORT}-masked.example',
      },
    })
    const view = (info) => ({
      internet: info.allowInternetAccess ?? null,
      allow_out: info.network?.allowOut ?? [],
      deny_out: info.network?.denyOut ?? [],
      public: info.network?.allowPublicTraffic ?? null,
      mask: info.network?.maskRequestHost ?? null,
    })
    try {
      const created = view(await sbx.getInfo())
      await sbx.files.write('/home/user/echo.py', HEADER_ECHO)
      await sbx.commands.run('python3 /home/user/echo.py', { background: true })
      const url = `https://${sbx.getHost(8001)}/`
      let seen = ''
      const ok = await waitUntil(async () => {
        let response
        try {
          response = await fetch(url, {
            headers: { 'E2B-Traffic-Access-Token': sbx.trafficAccessToken },
            signal: AbortSignal.timeout(5000),
          })
          seen = await response.text()
        } catch {
          return false
        }
        return response.status === 200
      })
      const withoutToken = (await fetch(url, { signal: AbortSignal.timeout(5000) })).status
      await sbx.updateNetwork({ allowOut: ['10.93.0.0/16'], allowInternetAccess: true })
      const updated = view(await sbx.getInfo())
      const headers = Object.fromEntries(
        seen
          .split('\n')
          .filter((line) => line.includes(': '))
          .map((line) => [line.slice(0, line.indexOf(': ')), line.slice(line.indexOf(': ') + 2)]),
      )
      return { created, served: ok, headers, without_token: withoutToken, updated }
    } finally {
      await sbx.kill()
    }
  },

  // onTimeout "pause" (with and without memory), autoResume, and connect's new timeout.
  'sandbox/lifecycle-on-timeout': async () => {
    const state = async (id) => (await Sandbox.getInfo(id)).state
    // Created with room for the set-up (a slow backend's create takes seconds), then given a short timeout:
    // the timer setTimeout re-arms still carries the lifecycle chosen at create.
    const memory = await Sandbox.create({ timeoutMs: 60000, lifecycle: { onTimeout: 'pause', autoResume: false } })
    const disk = await Sandbox.create({
      timeoutMs: 60000,
      lifecycle: { onTimeout: { action: 'pause', keepMemory: false } },
    })
    const woken = await Sandbox.create({ timeoutMs: 120000, lifecycle: { onTimeout: 'pause', autoResume: true } })
    try {
      const lifecycle = (await memory.getInfo()).lifecycle
      await memory.files.write('/home/user/kept.txt', 'kept')
      const keptPid = (await memory.commands.run('sleep 600', { background: true })).pid
      const diskPid = (await disk.commands.run('sleep 600', { background: true })).pid
      await memory.setTimeout(3000)
      await disk.setTimeout(3000)
      const memoryPaused = await waitUntil(async () => (await state(memory.sandboxId)) === 'paused', 40)
      const diskPaused = await waitUntil(async () => (await state(disk.sandboxId)) === 'paused', 40)
      const again = await Sandbox.connect(memory.sandboxId, { timeoutMs: 60000 })
      const info = await again.getInfo()
      const remaining = (info.endAt.getTime() - Date.now()) / 1000
      const diskAgain = await Sandbox.connect(disk.sandboxId, { timeoutMs: 60000 })
      await woken.pause()
      const wokenPaused = await state(woken.sandboxId)
      const wokenOutput = (await woken.commands.run('echo woken')).stdout // traffic resumes it
      return {
        lifecycle: lifecycle ? { on_timeout: lifecycle.onTimeout, auto_resume: lifecycle.autoResume } : null,
        memory_paused: memoryPaused,
        file: await again.files.read('/home/user/kept.txt'),
        memory_process_kept: (await again.commands.list()).some((p) => p.pid === keptPid),
        remaining_ok: remaining > 40 && remaining <= 61,
        disk_paused: diskPaused,
        disk_process_gone: !(await diskAgain.commands.list()).some((p) => p.pid === diskPid),
        woken_paused: wokenPaused,
        woken_output: wokenOutput,
        woken_state: await state(woken.sandboxId),
      }
    } finally {
      await Promise.allSettled([memory, disk, woken].map((sbx) => sbx.kill()))
    }
  },

  // Every control-plane operation, tried with another owner's key on this owner's sandbox.
  'sandbox/owners-every-operation': async () => {
    const apiKey = process.env.SECOND_API_KEY
    if (!apiKey) throw new Error('SECOND_API_KEY is not set')
    // What a call gave another owner: its value, or the name of the error it raised.
    const answer = async (call) => {
      let value
      try {
        value = await call()
      } catch (e) {
        if (!(e instanceof SandboxError)) throw e
        return e.constructor.name
      }
      return typeof value === 'boolean' || value === undefined || value === null ? (value ?? null) : 'answered'
    }
    const sbx = await Sandbox.create({ timeoutMs: 120000 })
    let snapshot = null
    try {
      snapshot = await sbx.createSnapshot()
      const sid = sbx.sandboxId
      const answers = {
        get_info: await answer(() => Sandbox.getInfo(sid, { apiKey })),
        set_timeout: await answer(() => Sandbox.setTimeout(sid, 5000, { apiKey })),
        update_network: await answer(() => Sandbox.updateNetwork(sid, { allowOut: [] }, { apiKey })),
        get_metrics: await answer(() => Sandbox.getMetrics(sid, { apiKey })),
        pause: await answer(() => Sandbox.pause(sid, { apiKey })),
        create_snapshot: await answer(() => Sandbox.createSnapshot(sid, { apiKey })),
        connect: await answer(() => Sandbox.connect(sid, { apiKey })),
        kill: await answer(() => Sandbox.kill(sid, { apiKey })),
        delete_snapshot: await answer(() => Sandbox.deleteSnapshot(snapshot.snapshotId, { apiKey })),
      }
      const listed = (await Sandbox.list({ apiKey }).nextItems()).map((s) => s.sandboxId)
      const snapshots = (await Sandbox.listSnapshots({ sandboxId: sid, apiKey }).nextItems()).map((s) => s.snapshotId)
      const own = (await Sandbox.listSnapshots({ sandboxId: sid }).nextItems()).map((s) => s.snapshotId)
      const info = await sbx.getInfo()
      return {
        answers,
        listed_for_other: listed.includes(sid),
        snapshots_for_other: snapshots,
        snapshot_kept: own.includes(snapshot.snapshotId),
        still_running: info.state === 'running',
        timeout_kept: (info.endAt.getTime() - Date.now()) / 1000 > 60,
      }
    } finally {
      await sbx.kill()
      if (snapshot) await Sandbox.deleteSnapshot(snapshot.snapshotId)
    }
  },

  // Who each request acts as (the user option), and the envd token a secure sandbox demands.
  'sandbox/users-and-tokens': async () => {
    const raised = async (call) => {
      try {
        await call()
      } catch (e) {
        return e.constructor.name
      }
      return null
    }
    const sbx = await Sandbox.create({ timeoutMs: 120000, secure: true })
    const open = await Sandbox.create({ timeoutMs: 120000, secure: false })
    try {
      const files = sbx.files
      const root = { user: 'root' }
      const asRoot = {
        make_dir: await files.makeDir('/root/made', root),
        write: (await files.write('/root/made/f.txt', 'secret', root)).path,
        read: await files.read('/root/made/f.txt', root),
        list: (await files.list('/root/made', root)).map((e) => e.name),
        stat: (await files.getInfo('/root/made/f.txt', root)).size,
        rename: (await files.rename('/root/made/f.txt', '/root/made/g.txt', root)).path,
      }
      const asUser = {
        make_dir: await raised(() => files.makeDir('/root/other')),
        write: await raised(() => files.write('/root/made/h.txt', 'x')),
        read: await raised(() => files.read('/root/made/g.txt')),
        list: await raised(() => files.list('/root/made')),
        rename: await raised(() => files.rename('/root/made/h.txt', '/root/made/h2.txt')),
        remove: await raised(() => files.remove('/root/made/h2.txt')),
      }
      await files.remove('/root/made/g.txt', root)
      asRoot.removed = !(await files.exists('/root/made/g.txt', root))
      await files.write('/home/user/mine.txt', 'mine')
      await files.write('/tmp/roots.txt', "root's", root)
      const owners = (await sbx.commands.run('stat -c %U /home/user/mine.txt /tmp/roots.txt')).stdout.split(/\s+/).filter(Boolean)
      const whoami = [(await sbx.commands.run('id -un', root)).stdout, (await sbx.commands.run('id -un')).stdout]
      // Process and watch calls on the secure sandbox: refused without the token, served with it.
      const cat = await sbx.commands.run('cat', { background: true, stdin: true })
      const sleeper = await sbx.commands.run('sleep 600', { background: true })
      const terminal = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
      await files.makeDir('/home/user/watched')
      const rpcWithoutToken = await rpcStatusesWithoutToken(sbx, cat.pid, sleeper.pid, terminal.pid)
      const again = await sbx.commands.connect(cat.pid)
      await sbx.commands.sendStdin(cat.pid, 'through the token\n')
      await sbx.commands.closeStdin(cat.pid)
      await sbx.pty.resize(terminal.pid, { cols: 100, rows: 30 })
      const killed = await sbx.commands.kill(sleeper.pid)
      const names = []
      const watcher = await files.watchDir('/home/user/watched', (event) => names.push(event.name))
      await files.write('/home/user/watched/w.txt', 'w')
      const watched = await waitUntil(async () => names.includes('w.txt'), 10)
      await watcher.stop()
      const rpcWithToken = { stdin: (await again.wait()).stdout, resized: true, killed, watched }
      const raw = async (target) => {
        const base = `https://${target.getHost(49983)}`
        const rpc = { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' }
        const signal = () => AbortSignal.timeout(10000)
        const form = new FormData()
        form.append('file', new Blob(['x']), 'x')
        return {
          download: (await fetch(`${base}/files?path=%2Fetc%2Fhostname`, { signal: signal() })).status,
          upload: (await fetch(`${base}/files?path=%2Ftmp%2Fx`, { method: 'POST', body: form, signal: signal() })).status,
          list: (await fetch(`${base}/process.Process/List`, { method: 'POST', body: '{}', headers: rpc, signal: signal() })).status,
          stat: (
            await fetch(`${base}/filesystem.Filesystem/Stat`, {
              method: 'POST',
              body: JSON.stringify({ path: '/tmp' }),
              headers: rpc,
              signal: signal(),
            })
          ).status,
        }
      }
      return {
        as_root: asRoot,
        as_user: asUser,
        owners,
        whoami,
        secure_without_token: await raw(sbx),
        public_without_token: await raw(open),
        client_version: require('e2b/package.json').version, // from 2.51 it ignores secure: false
        rpc_without_token: rpcWithoutToken,
        rpc_with_token: rpcWithToken,
      }
    } finally {
      await Promise.allSettled([sbx.kill(), open.kill()])
    }
  },
}

// A secure sandbox's signed file URLs, fetched without its token: good, tampered and expired ones.
scenarios['sandbox/signed-urls'] = async () => {
  const sbx = await Sandbox.create({ timeoutMs: 120000, secure: true })
  try {
    const path = '/home/user/signed.txt'
    await sbx.files.write(path, 'signed content')
    const get = async (url) => {
      const response = await fetch(url, { signal: AbortSignal.timeout(10000) })
      const text = await response.text()
      return [response.status, response.status === 200 ? text : null]
    }
    const post = async (url, content) => {
      const form = new FormData()
      form.append('file', new Blob([content]), 'f.txt')
      const response = await fetch(url, { method: 'POST', body: form, signal: AbortSignal.timeout(10000) })
      await response.arrayBuffer()
      return response.status
    }
    const tampered = (url) => {
      const changed = new URL(url)
      const signature = changed.searchParams.get('signature')
      changed.searchParams.set('signature', signature.slice(0, -1) + (signature.endsWith('A') ? 'B' : 'A'))
      return changed.toString()
    }
    const withoutExpiration = (url) => {
      const changed = new URL(url)
      changed.searchParams.delete('signature_expiration')
      return changed.toString()
    }
    const download = await sbx.downloadUrl(path)
    const expiring = await sbx.downloadUrl(path, { useSignatureExpiration: 120 })
    const upload = await sbx.uploadUrl('/home/user/up.txt')
    const uploadExpiring = await sbx.uploadUrl('/home/user/up-expiring.txt', { useSignatureExpiration: 120 })
    const result = {
      has_signature: download.includes('signature=') && expiring.includes('signature_expiration='),
      download: await get(download),
      download_tampered: (await get(tampered(download)))[0],
      download_expiring: await get(expiring),
      download_expired: (await get(await sbx.downloadUrl(path, { useSignatureExpiration: -30 })))[0],
      download_expiration_dropped: (await get(withoutExpiration(expiring)))[0],
    }
    result.upload = await post(upload, 'uploaded')
    result.upload_tampered = await post(tampered(await sbx.uploadUrl('/home/user/up-tampered.txt')), 'x')
    result.upload_expiring = await post(uploadExpiring, 'uploaded before expiry')
    result.upload_expired = await post(await sbx.uploadUrl('/home/user/up-late.txt', { useSignatureExpiration: -30 }), 'x')
    result.upload_read_signature = await post(await sbx.downloadUrl('/home/user/up-read.txt'), 'x')
    result.uploaded = {}
    for (const name of ['up.txt', 'up-expiring.txt', 'up-tampered.txt', 'up-late.txt', 'up-read.txt']) {
      const target = `/home/user/${name}`
      result.uploaded[name] = (await sbx.files.exists(target)) ? await sbx.files.read(target) : null
    }
    return result
  } finally {
    await sbx.kill()
  }
}

const TEMPLATE_PROBE =
  'cat copied.txt built.txt; echo $TPL_VAR; pwd; whoami; curl -s -o /dev/null -w %{http_code} 127.0.0.1:8000'

scenarios['sandbox/template-build'] = async (work) => {
  const fs = require('node:fs')
  const path = require('node:path')
  const context = path.join(work, 'template-context')
  fs.mkdirSync(context, { recursive: true })
  fs.writeFileSync(path.join(context, 'copied.txt'), 'copied file\n')
  const name = `conf-${crypto.randomBytes(6).toString('hex')}`
  const template = Template({ fileContextPath: context })
    .fromBaseImage()
    .setWorkdir('/home/user/app')
    .copy('copied.txt', './')
    .setEnvs({ TPL_VAR: 'from-template' })
    .runCmd('echo built > built.txt')
    .setStartCmd('python3 -m http.server 8000 --bind 127.0.0.1', waitForPort(8000))
  const result = {}
  const info = await Template.build(template, name, { tags: ['t1'], cpuCount: 1, memoryMB: 512 })
  try {
    result.build_tags = info.tags
    result.exists = [await Template.exists(name), await Template.exists(`${name}-missing`)]
    const sbx = await Sandbox.create(`${name}:t1`, { timeoutMs: 120_000 })
    try {
      result.probe = (await sbx.commands.run(TEMPLATE_PROBE)).stdout.split(/\s+/).filter(Boolean)
      result.template_id = (await sbx.getInfo()).templateId === info.templateId
    } finally {
      await sbx.kill()
    }
    const child = Template().fromTemplate(`${name}:t1`).runCmd('echo child > child.txt')
    await Template.build(child, `${name}-child`, { cpuCount: 1, memoryMB: 512 })
    const childBox = await Sandbox.create(`${name}-child`, { timeoutMs: 120_000 })
    try {
      result.child = (await childBox.commands.run('cat built.txt child.txt; pwd')).stdout.split(/\s+/).filter(Boolean)
    } finally {
      await childBox.kill()
    }
    const second = process.env.SECOND_API_KEY // another owner sees none of it
    result.other_exists = await Template.exists(name, { apiKey: second })
    try {
      await (await Sandbox.create(`${name}:t1`, { timeoutMs: 60_000, apiKey: second })).kill()
      result.other_create = 'created'
    } catch (err) {
      if (!(err instanceof SandboxError)) throw err
      result.other_create = String(err.message).slice(0, 3)
    }
    try {
      await Template.getTags(name, { apiKey: second })
      result.other_tags = 'listed'
    } catch (err) {
      result.other_tags = String(err.message).slice(0, 3)
    }
    result.assigned = (await Template.assignTags(`${name}:t1`, ['t2'])).tags
    result.tags = (await Template.getTags(name)).map((tag) => tag.tag).sort()
    await Template.removeTags(name, ['t1'])
    result.tags_after = (await Template.getTags(name)).map((tag) => tag.tag).sort()
    try {
      await Template.build(Template().fromBaseImage().runCmd('echo step-output; exit 4'), `${name}-broken`)
      result.failure = 'built'
    } catch (err) {
      if (!(err instanceof BuildError)) throw err
      result.failure = String(err.message)
    }
    result.deleted = await Sandbox.deleteSnapshot(info.templateId)
    try {
      await (await Sandbox.create(`${name}:t2`, { timeoutMs: 60_000 })).kill()
      result.after_delete = 'created'
    } catch (err) {
      if (!(err instanceof SandboxError)) throw err
      result.after_delete = String(err.message).slice(0, 3)
    }
    return result
  } finally {
    for (const leftover of [`${name}-child`, info.templateId, `${name}-broken`]) {
      await Sandbox.deleteSnapshot(leftover)
    }
  }
}

const IMAGE_PROBE = 'cat /home/user/built.txt; echo $IMAGE_VAR; echo /opt/old/*; whoami; test -e /etc/motd || echo no-motd'

scenarios['sandbox/template-image'] = async () => {
  // The harness's registry (IMAGE_*): a private image, its layers' whiteouts, its environment.
  const { IMAGE_REF: image, IMAGE_USERNAME: username, IMAGE_PASSWORD: password } = process.env
  const name = `conf-image-${crypto.randomBytes(6).toString('hex')}`
  const template = Template().fromImage(image, { username, password }).runCmd('echo built > built.txt')
  const result = {}
  const info = await Template.build(template, name, { cpuCount: 1, memoryMB: 512 })
  try {
    const sbx = await Sandbox.create(name, { timeoutMs: 120_000 })
    try {
      result.probe = (await sbx.commands.run(IMAGE_PROBE)).stdout.split(/\s+/).filter(Boolean)
    } finally {
      await sbx.kill()
    }
    try {
      await Template.build(Template().fromImage(image, { username, password: `not-${password}` }), `${name}-denied`)
      result.denied = 'built'
    } catch (err) {
      if (!(err instanceof BuildError)) throw err
      result.denied = String(err.message)
    }
    result.password_shown = result.denied.includes(password)
    return result
  } finally {
    for (const leftover of [info.templateId, `${name}-denied`]) {
      await Sandbox.deleteSnapshot(leftover)
    }
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
