// Scenarios for the official JS client (e2b on npm), in debug mode against the agent.
// Run as `node js.cjs <scenario> <workdir>` with NODE_PATH at the pinned clients' node_modules,
// so only the official packages resolve. Each scenario prints one JSON object.
'use strict'

const { Sandbox, CommandExitError } = require('e2b')

const scenarios = {
  'commands/foreground': async (sbx, work) => {
    const where = `${work}/elsewhere` // not the user's home, where a command runs without a cwd
    await sbx.commands.run(`mkdir -p ${where}`)
    const r = await sbx.commands.run('echo "$GREETING from $(pwd)"; echo oops >&2', { envs: { GREETING: 'hi' }, cwd: where })
    return { stdout: r.stdout, stderr: r.stderr, exit_code: r.exitCode }
  },
  'commands/exit-code': async (sbx) => {
    try {
      await sbx.commands.run('echo partial; echo failing >&2; exit 3')
    } catch (e) {
      return { raised: e instanceof CommandExitError, exit_code: e.exitCode, stdout: e.stdout, stderr: e.stderr }
    }
    return { raised: false }
  },
  'commands/stdin': async (sbx) => {
    const handle = await sbx.commands.run('cat', { background: true, stdin: true })
    const listed = (await sbx.commands.list()).some((p) => p.pid === handle.pid)
    await sbx.commands.sendStdin(handle.pid, 'first line\n')
    await sbx.commands.sendStdin(handle.pid, 'second line\n')
    await sbx.commands.closeStdin(handle.pid)
    const result = await handle.wait()
    return { listed, stdout: result.stdout, stderr: result.stderr, exit_code: result.exitCode }
  },
  'commands/kill': async (sbx) => {
    const handle = await sbx.commands.run('sleep 30', { background: true })
    const killed = await sbx.commands.kill(handle.pid)
    let outcome = { raised: false }
    try {
      await handle.wait()
    } catch (e) {
      outcome = { raised: true, exit_code: e.exitCode, error: e.error }
    }
    return { killed, kill_unknown: await sbx.commands.kill(handle.pid), ...outcome }
  },
  'commands/background-connect': async (sbx) => {
    const handle = await sbx.commands.run('sleep 0.5; echo done', { background: true })
    const again = await sbx.commands.connect(handle.pid)
    const result = await again.wait()
    return { stdout: result.stdout, exit_code: result.exitCode }
  },
  'commands/timeout': async (sbx, work) => {
    const marker = `${work}/timeout-survived` // written only if the command outlives its 1 s deadline
    const started = Date.now()
    let raised = null
    try {
      await sbx.commands.run(`sleep 2; touch ${marker}`, { timeoutMs: 1000 })
    } catch (e) {
      raised = e.name
    }
    const elapsed = (Date.now() - started) / 1000
    await sleep(Math.max(0, started + 3000 - Date.now())) // a surviving command has written its marker by now
    return { raised, elapsed, process_survived: await sbx.files.exists(marker) }
  },
  'pty/session': async (sbx) => {
    const chunks = []
    const output = () => Buffer.concat(chunks).toString('utf8')
    const handle = await sbx.pty.create({ cols: 100, rows: 30, onData: (d) => chunks.push(Buffer.from(d)) })
    await sbx.pty.sendInput(handle.pid, new TextEncoder().encode('stty size; echo FIRST-$((1+1))\n')) // the size asked for at start
    await until(() => output().includes('FIRST-2')) // the first size is out before the resize
    await sbx.pty.resize(handle.pid, { cols: 120, rows: 40 })
    await sbx.pty.sendInput(handle.pid, new TextEncoder().encode('echo MARK-$((20+22)); stty size; exit\n'))
    const result = await handle.wait()
    return { output: Buffer.concat(chunks).toString('utf8'), exit_code: result.exitCode }
  },
  'files/text-bytes-stream': async (sbx, work) => {
    const textPath = `${work}/t/hello.txt`
    const binPath = `${work}/b/data.bin`
    const info = await sbx.files.write(textPath, 'héllo\n')
    const payload = Buffer.alloc(1024)
    for (let i = 0; i < payload.length; i++) payload[i] = i % 256
    await sbx.files.write(binPath, payload)
    const bytes = Buffer.from(await sbx.files.read(binPath, { format: 'bytes' }))
    const stream = await sbx.files.read(binPath, { format: 'stream' })
    const parts = []
    for await (const part of stream) parts.push(Buffer.from(part))
    return {
      write: { name: info.name, path: info.path, type: info.type },
      text: await sbx.files.read(textPath),
      bytes_equal: bytes.equals(payload),
      stream_equal: Buffer.concat(parts).equals(payload),
      relative: (await sbx.files.write('relative-from-home.txt', 'x')).path,
    }
  },
  'files/write-many': async (sbx, work) => {
    const entries = [0, 1, 2, 3, 4].map((i) => ({ path: `${work}/many/${i}/f${i}.txt`, data: `file ${i}` }))
    const infos = await sbx.files.write(entries)
    const contents = []
    for (const e of entries) contents.push(await sbx.files.read(e.path))
    return { paths: infos.map((i) => i.path), contents }
  },
  'files/list-stat-exists': async (sbx, work) => {
    await sbx.files.write(`${work}/tree/a/b/c.txt`, 'c')
    await sbx.files.write(`${work}/tree/top.txt`, 'top')
    const depth1 = (await sbx.files.list(`${work}/tree`)).map((e) => e.path)
    const depth3 = (await sbx.files.list(`${work}/tree`, { depth: 3 })).map((e) => e.path)
    const info = await sbx.files.getInfo(`${work}/tree/top.txt`)
    return {
      depth1,
      depth3,
      info: { name: info.name, type: info.type, size: info.size, mode: info.mode, permissions: info.permissions, path: info.path },
      exists: await sbx.files.exists(`${work}/tree/top.txt`),
      exists_missing: await sbx.files.exists(`${work}/nope`),
    }
  },
  // A symlink as the client lists and stats it: its target's type (this client reads no isSymlink), its target's path.
  'files/symlink': async (sbx, work) => {
    await sbx.files.write(`${work}/links/file.txt`, 'target')
    await sbx.commands.run(`ln -sfn ${work}/links/file.txt ${work}/links/to-file && ln -sfn ${work}/links/gone ${work}/links/dangling`)
    const shown = (entry) => ({ type: entry.type ?? null, target: entry.symlinkTarget ?? null })
    const listed = Object.fromEntries((await sbx.files.list(`${work}/links`)).map((e) => [e.name, shown(e)]))
    return {
      client: 'npm',
      client_version: require('e2b/package.json').version,
      listed,
      info: shown(await sbx.files.getInfo(`${work}/links/to-file`)),
      dangling_info: shown(await sbx.files.getInfo(`${work}/links/dangling`)),
      work,
    }
  },
  'files/make-dir-rename-remove': async (sbx, work) => {
    const first = await sbx.files.makeDir(`${work}/made/deep`)
    const second = await sbx.files.makeDir(`${work}/made/deep`)
    await sbx.files.write(`${work}/made/old.txt`, 'moving')
    const renamed = await sbx.files.rename(`${work}/made/old.txt`, `${work}/made/sub/new.txt`)
    await sbx.files.remove(`${work}/made/deep`)
    await sbx.files.remove(`${work}/made/never-existed`)
    return {
      first,
      second,
      renamed_path: renamed.path,
      old_exists: await sbx.files.exists(`${work}/made/old.txt`),
      new_content: await sbx.files.read(`${work}/made/sub/new.txt`),
      deep_exists: await sbx.files.exists(`${work}/made/deep`),
    }
  },
  'watch/stream': async (sbx, work) => {
    const root = `${work}/watched`
    await sbx.files.makeDir(root)
    const events = []
    const handle = await sbx.files.watchDir(root, (e) => events.push([e.type, e.name]), { recursive: true })
    await sbx.files.write(`${root}/a.txt`, 'a')
    await sbx.commands.run(`echo more >> ${root}/a.txt; mkdir -p ${root}/sub/deeper; mv ${root}/a.txt ${root}/sub/b.txt`)
    await sbx.files.remove(`${root}/sub/b.txt`)
    for (let i = 0; i < 100 && !events.some(([t, n]) => t === 'remove' && n === 'sub/b.txt'); i++) {
      await new Promise((resolve) => setTimeout(resolve, 100)) // events arrive asynchronously (at most 10 s)
    }
    await handle.stop()
    return { events, watcher: 'WatchDir' }
  },
  'watch/stream-options': async (sbx, work) => {
    const root = `${work}/watched-options`
    await sbx.commands.run(`mkdir -p ${root}`)
    const seen = { with_entry: [], without_entry: [] }
    const record = (key) => (e) => seen[key].push([e.type, e.name, entry(e.entry)])
    const withEntry = await sbx.files.watchDir(root, record('with_entry'), { includeEntry: true })
    const withoutEntry = await sbx.files.watchDir(root, record('without_entry'))
    await sbx.files.write(`${root}/e.txt`, '12345')
    await sbx.commands.run(`mkdir ${root}/d`)
    const has = (got, type, name) => got.some((e) => e[0] === type && e[1] === name)
    await until(() => Object.values(seen).every((got) => has(got, 'write', 'e.txt') && has(got, 'create', 'd')))
    await withEntry.stop()
    await withoutEntry.stop()
    // A relative path is resolved against the acting user's home: the folder exists in root's only.
    const name = 'watch-as-root-js'
    await sbx.commands.run(`rm -rf ~/${name}; mkdir ~/${name}`, { user: 'root' })
    let asUser = null
    try {
      await (await sbx.files.watchDir(name, () => {}, { user: 'user' })).stop()
    } catch (e) {
      asUser = e.name
    }
    const rootEvents = []
    const asRoot = await sbx.files.watchDir(name, (e) => rootEvents.push([e.type, e.name]), { user: 'root' })
    await sbx.commands.run(`touch ~/${name}/r.txt`, { user: 'root' })
    await until(() => has(rootEvents, 'create', 'r.txt'), 50)
    await asRoot.stop()
    await sbx.commands.run(`rm -rf ~/${name}`, { user: 'root' })
    return { ...seen, as_user_error: asUser, as_root_events: rootEvents }
  },
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// Wait for a condition that asynchronous events make true (at most tries / 10 s).
async function until(condition, tries = 100) {
  for (let i = 0; i < tries && !condition(); i++) await sleep(100)
}

function entry(info) {
  return info ? { name: info.name, type: info.type ?? null, size: info.size, path: info.path } : null
}

// Commands and file round trips in parallel on one sandbox: each must get its own answer.
scenarios['concurrency/commands-and-files'] = async (sbx, work) => {
  const crypto = require('node:crypto')
  const PARALLEL = 16
  const sha = (data) => crypto.createHash('sha256').update(data).digest('hex')
  const command = async (n) => {
    try {
      const r = await sbx.commands.run(`echo start-${n}; sleep 0.2; echo end-${n} >&2; exit ${n % 3}`, {
        cwd: work,
        envs: { N: String(n) },
      })
      return [n, r.stdout, r.stderr, r.exitCode]
    } catch (e) {
      if (e.exitCode === undefined) throw e // a non-zero exit is part of the answer; anything else is not
      return [n, e.stdout, e.stderr, e.exitCode]
    }
  }
  const roundTrip = async (n) => {
    const content = Buffer.from(`file ${n} `.repeat(n * 512 + 1))
    await sbx.files.write(`${work}/parallel/${n}.bin`, new Uint8Array(content).buffer)
    const back = Buffer.from(await sbx.files.read(`${work}/parallel/${n}.bin`, { format: 'bytes' }))
    return [n, sha(content), sha(back), back.length]
  }
  const range = Array.from({ length: PARALLEL }, (_, n) => n)
  const [commands, files] = await Promise.all([Promise.all(range.map(command)), Promise.all(range.map(roundTrip))])
  return { commands, files }
}

// Every example of the file process.argv[4] (generated by the harness with Hypothesis) on one sandbox.
scenarios['properties/batch'] = async (sbx, work) => {
  const examples = JSON.parse(require('node:fs').readFileSync(process.argv[4], 'utf8'))
  const files = []
  for (const example of examples.files) {
    const path = `${work}/${example.path}`
    const data = Buffer.from(example.data, 'base64')
    await sbx.files.write(path, data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength))
    const back = Buffer.from(await sbx.files.read(path, { format: 'bytes' }))
    files.push({ path, sha256: require('node:crypto').createHash('sha256').update(back).digest('hex') })
  }
  const commands = []
  for (const example of examples.commands) {
    let result
    try {
      result = await sbx.commands.run(example.cmd, { envs: example.envs })
    } catch (e) {
      if (!(e instanceof CommandExitError)) throw e
      result = e
    }
    commands.push({ exit_code: result.exitCode, stdout: result.stdout, stderr: result.stderr })
  }
  return { files, commands }
}

// Payload size classes: empty, one byte, just over 64 KiB, several MiB (files and command output).
scenarios['files/size-classes'] = async (sbx, work) => {
  const crypto = require('node:crypto')
  const sha = (data) => crypto.createHash('sha256').update(data).digest('hex')
  const files = []
  for (const size of [0, 1, 65537, 8 * 1024 * 1024 + 3]) {
    const data = crypto.randomBytes(size)
    const path = `${work}/sizes/${size}.bin`
    await sbx.files.write(path, data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength), {
      requestTimeoutMs: 120000,
    })
    const back = Buffer.from(await sbx.files.read(path, { format: 'bytes', requestTimeoutMs: 120000 }))
    const stored = (await sbx.commands.run(`sha256sum ${path}`)).stdout.split(' ')[0]
    const info = await sbx.files.getInfo(path)
    files.push({ size, written: sha(data), read: sha(back), read_size: back.length, info_size: info.size, stored })
  }
  await sbx.files.write(`${work}/sizes/empty.txt`, '')
  const outputs = []
  const letters = (text) => [...new Set(text)].sort()
  for (const size of [0, 1, 4 * 1024 * 1024]) {
    const r = await sbx.commands.run(`head -c ${size} /dev/zero | tr '\\0' a; head -c ${size} /dev/zero | tr '\\0' b >&2`)
    outputs.push({ size, stdout: [r.stdout.length, letters(r.stdout)], stderr: [r.stderr.length, letters(r.stderr)] })
  }
  const SEQ = 200000
  const seq = await sbx.commands.run(`seq 1 ${SEQ}`)
  return { files, empty_text: await sbx.files.read(`${work}/sizes/empty.txt`), outputs, seq: [SEQ, sha(seq.stdout)] }
}

// The errors the client raises for requests the agent refuses: class and message, as a user sees them.
scenarios['errors/messages'] = async (sbx, work) => {
  const error = async (call) => {
    try {
      await call()
    } catch (e) {
      return [e.constructor.name, String(e.message), e.exitCode ?? null, e.stderr ?? null]
    }
    return ['none', '', null, null]
  }
  const folder = `${work}/errors`
  const plain = `${folder}/plain.txt`
  await sbx.files.write(plain, 'plain')
  return {
    read_missing: await error(() => sbx.files.read(`${folder}/missing.txt`)),
    info_missing: await error(() => sbx.files.getInfo(`${folder}/missing.txt`)),
    list_missing: await error(() => sbx.files.list(`${folder}/missing`)),
    list_file: await error(() => sbx.files.list(plain)),
    write_under_file: await error(() => sbx.files.write(`${plain}/child.txt`, 'x')),
    make_dir_under_file: await error(() => sbx.files.makeDir(`${plain}/sub`)),
    rename_missing: await error(() => sbx.files.rename(`${folder}/missing.txt`, `${folder}/other.txt`)),
    cwd_missing: await error(() => sbx.commands.run('true', { cwd: `${folder}/no-such-dir` })),
    connect_unknown: await error(() => sbx.commands.connect(999999)),
    unknown_command: await error(() => sbx.commands.run('no-such-command-e2b')),
    folder,
  }
}

async function main() {
  const [name, work] = process.argv.slice(2)
  process.stderr.write(`js:envd/${name}:start\n`)
  const sbx = await Sandbox.create()
  try {
    process.stderr.write(`js:envd/${name}:created ${sbx.sandboxId}\n`)
    const result = await scenarios[name](sbx, work)
    process.stderr.write(`js:envd/${name}:done\n`)
    console.log(JSON.stringify(result))
  } finally {
    await sbx.kill()
  }
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
