// The wire recorder's fixed script for the official JS client (e2b on npm).
// Run as `node js.cjs` with NODE_PATH at the pinned clients' node_modules, so only the official
// packages resolve, against the fixture server, configured only by E2B_API_KEY, E2B_API_URL and
// E2B_SANDBOX_URL. The calls and their order are the recording (the same as py_sync.py); prints
// one JSON object with the same keys.
'use strict'

const { Sandbox } = require('e2b')

const HOME = '/home/user'

async function main() {
  const sbx = await Sandbox.create({ metadata: { recorder: 'wire' }, envs: { FIXTURE: '1' }, timeoutMs: 120000 })
  const info = await sbx.getInfo()
  const run = await sbx.commands.run('echo fixture')
  const processes = await sbx.commands.list()
  const written = await sbx.files.write(`${HOME}/fixture.txt`, 'fixture file\n')
  const content = await sbx.files.read(`${HOME}/fixture.txt`)
  const made = await sbx.files.makeDir(`${HOME}/fixture-dir`)
  const entries = await sbx.files.list(HOME)
  const exists = await sbx.files.exists(`${HOME}/fixture.txt`)
  const paginator = Sandbox.list({ query: { metadata: { recorder: 'wire' } }, limit: 1 })
  const pages = []
  while (paginator.hasNext) {
    pages.push((await paginator.nextItems()).map((item) => item.sandboxId))
  }
  await sbx.setTimeout(60000)
  const paused = await sbx.pause()
  const pausedAgain = await sbx.pause()
  const connected = await sbx.connect({ timeoutMs: 120000 })
  const snapshot = await sbx.createSnapshot()
  const snapshots = (await sbx.listSnapshots().nextItems()).map((s) => s.snapshotId)
  const deleted = await Sandbox.deleteSnapshot(snapshot.snapshotId)
  const metrics = await sbx.getMetrics()
  const killed = await sbx.kill()
  const killedAgain = await sbx.kill()
  return {
    client_version: require('e2b/package.json').version,
    sandbox_id: sbx.sandboxId,
    info: { state: info.state, metadata: info.metadata, template_id: info.templateId },
    run: { stdout: run.stdout, stderr: run.stderr, exit_code: run.exitCode },
    processes: processes.map((p) => p.pid),
    written: { name: written.name, path: written.path, type: written.type ?? null },
    read: content,
    made_dir: made,
    listed: entries.map((e) => e.name),
    exists,
    pages,
    paused,
    paused_again: pausedAgain,
    connected: connected.sandboxId,
    snapshot: { id: snapshot.snapshotId, names: snapshot.names },
    snapshots,
    deleted_snapshot: deleted,
    metrics: metrics.length,
    killed,
    killed_again: killedAgain,
  }
}

main().then(
  (result) => console.log(JSON.stringify(result)),
  (err) => {
    console.error(err)
    process.exit(1)
  },
)
