// Code-interpreter scenarios for the official JS interpreter client (@e2b/code-interpreter on npm).
// Run as `node js.cjs <scenario> <workdir>` with NODE_PATH at the pinned clients' node_modules, so
// only the official packages resolve, and with only E2B_API_KEY, E2B_DOMAIN, SSL_CERT_FILE and
// NODE_EXTRA_CA_CERTS set. main() creates the scenario's sandbox with Sandbox.create() (default
// template code-interpreter-v1; a scenario may add create options), kills it in `finally` and
// prints the scenario's JSON object; the scenario names and result keys are those of py_sync.py.
// The working folder argument is not used: the kernels choose their own folders.
'use strict'

// The package's CommonJS build exports Sandbox plus everything of `e2b` (the error classes);
// Result, Execution and ChartType, though declared in its types, are not runtime exports.
const { Sandbox, NotFoundError, SandboxError, TimeoutError } = require('@e2b/code-interpreter')

// The same steps in every language but python (which the other scenarios cover), from beside this
// file; and a language no template has a kernel for.
const LANGUAGES = JSON.parse(require('node:fs').readFileSync(require('node:path').join(__dirname, 'languages.json'), 'utf8'))
const UNKNOWN_LANGUAGE = 'cobol'
const RESULT_CELLS = JSON.parse(require('node:fs').readFileSync(require('node:path').join(__dirname, 'results.json'), 'utf8'))
const LANGUAGE_CREATE = { envs: { GLOBAL_VAR: 'g' } }

let current = ''
function trace(stage) {
  process.stderr.write(`js:${current}:${stage}\n`)
}

// The client hands the chart over as the server sent it (no typed classes at run time).
function chartOf(chart) {
  if (!chart) return null
  return {
    class: null,
    type: chart.type ?? null,
    title: chart.title ?? null,
    x_label: chart.x_label ?? null,
    y_label: chart.y_label ?? null,
    elements: (chart.elements ?? []).map(elementOf),
  }
}

function elementOf(e) {
  if (e.points) return { label: e.label, points: e.points }
  if (e.elements) return { chart: chartOf(e) } // a superchart's: a chart of its own
  return { label: e.label ?? null, fields: Object.keys(e).filter((k) => k !== 'label').sort() }
}

function resultOf(r) {
  return {
    text: r.text ?? null,
    html: r.html ?? null,
    markdown: r.markdown ?? null,
    png_head: r.png ? Buffer.from(r.png, 'base64').subarray(0, 8).toString('hex') : null,
    svg: r.svg ?? null,
    latex: r.latex ?? null,
    json: r.json ?? null,
    javascript: r.javascript ?? null,
    chart: chartOf(r.chart),
    is_main_result: r.isMainResult ?? null,
    formats: r.formats(),
  }
}

function errorOf(error) {
  return error ? { name: error.name, value: error.value, traceback: error.traceback } : null
}

function executionOf(execution) {
  return {
    text: execution.text ?? null,
    results: execution.results.map(resultOf),
    stdout: execution.logs.stdout,
    stderr: execution.logs.stderr,
    error: errorOf(execution.error),
    execution_count: execution.executionCount ?? null,
  }
}

const PLOT = [
  'import matplotlib.pyplot as plt',
  'plt.plot([1, 2, 3], [1, 4, 9], label="squares")',
  'plt.title("Squares")',
  'plt.xlabel("x")',
  'plt.ylabel("y")',
  'plt.show()',
].join('\n')

const DISPLAY = [
  'from IPython.display import HTML, Markdown, display',
  'display(HTML("<b>hi</b>"))',
  'display(Markdown("**md**"))',
  '40 + 2',
].join('\n')

const SHOW_ENV = 'import json, os\nprint(json.dumps({k: os.environ.get(k) for k in ("RUN_VAR", "GLOBAL_VAR")}))'

// Whether the cell ran to its end shows in the kernel's globals afterwards: no clock involved.
const SLEEP = 'import time\ntime.sleep(60)\nfinished_sleeping = True'

// The kernel's own clock: whether the two runs overlapped inside the sandbox, not on the client.
const concurrentCode = (who) =>
  `import json, time\nstart = time.time()\ntime.sleep(2)\nprint(json.dumps({"who": "${who}", "start": start, "end": time.time()}))`

// The contexts routes as the clients call them, sent here without the traffic token ({id}: a context's).
const BARE_CONTEXTS = {
  create: ['POST', '/contexts'],
  list: ['GET', '/contexts'],
  restart: ['POST', '/contexts/{id}/restart'],
  remove: ['DELETE', '/contexts/{id}'],
}

// Each entry: [create options, scenario].
const scenarios = {
  'interpreter/run/basic': [
    {},
    async (sbx) => {
      const seen = { stdout: [], stderr: [], results: [], errors: [] }
      const first = await sbx.runCode('print("out")\nimport sys\nprint("err", file=sys.stderr)\n1+1', {
        onStdout: (message) => seen.stdout.push(message.line),
        onStderr: (message) => seen.stderr.push(message.line),
        onResult: (result) => seen.results.push({ text: result.text ?? null, is_main_result: result.isMainResult ?? null }),
        onError: (error) => seen.errors.push(error.name),
      })
      trace('first run')
      const second = await sbx.runCode('print("before")\n6*7')
      return { first: executionOf(first), callbacks: seen, second: executionOf(second) }
    },
  ],

  'interpreter/results/dataframe': [
    {},
    async (sbx) => executionOf(await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": [3, 4]})')),
  ],

  'interpreter/results/matplotlib': [{}, async (sbx) => executionOf(await sbx.runCode(PLOT))],

  'interpreter/results/charts': [
    {},
    async (sbx) => {
      const found = {}
      for (const [kind, code] of Object.entries(RESULT_CELLS.charts)) found[kind] = executionOf(await sbx.runCode(code))
      return found
    },
  ],

  'interpreter/results/rich': [{}, async (sbx) => executionOf(await sbx.runCode(RESULT_CELLS.rich))],

  'interpreter/results/display': [{}, async (sbx) => executionOf(await sbx.runCode(DISPLAY))],

  'interpreter/errors/traceback': [
    {},
    async (sbx) => {
      const errors = []
      let run
      try {
        run = await sbx.runCode('1/0', { onError: (error) => errors.push(error.name) })
      } catch (e) {
        if (!(e instanceof SandboxError)) throw e
        return { raised: e.constructor.name, message: e.message }
      }
      return { raised: null, execution: executionOf(run), on_error: errors }
    },
  ],

  'interpreter/execution-count': [
    {},
    async (sbx) => {
      const counts = []
      for (const code of ['1', '2', '3']) counts.push((await sbx.runCode(code)).executionCount ?? null)
      return { counts }
    },
  ],

  'interpreter/contexts/lifecycle': [
    {},
    async (sbx) => {
      const context = await sbx.createCodeContext({ cwd: '/tmp', language: 'python' })
      trace(`context ${context.id}`)
      const cwd = await sbx.runCode('import os\nprint(os.getcwd())', { context })
      await sbx.runCode('x = 41', { context })
      const persisted = await sbx.runCode('x + 1', { context })
      const listed = (await sbx.listCodeContexts())
        .filter((c) => c.id === context.id)
        .map((c) => ({ language: c.language, cwd: c.cwd }))
      await sbx.restartCodeContext(context)
      trace('restarted')
      const afterRestart = await sbx.runCode('x', { context })
      await sbx.removeCodeContext(context)
      trace('removed')
      const listedAfter = (await sbx.listCodeContexts()).some((c) => c.id === context.id)
      let runAfterRemove = null
      try {
        await sbx.runCode('1', { context })
      } catch (e) {
        if (!(e instanceof NotFoundError)) throw e
        runAfterRemove = e.constructor.name
      }
      return {
        created: { language: context.language, cwd: context.cwd, has_id: Boolean(context.id) },
        cwd_stdout: cwd.logs.stdout,
        persisted: persisted.text ?? null,
        listed,
        after_restart_error: errorOf(afterRestart.error),
        listed_after_remove: listedAfter,
        run_after_remove: runAfterRemove,
      }
    },
  ],

  'interpreter/env-vars/per-run': [
    { envs: { GLOBAL_VAR: 'g' } },
    async (sbx) => {
      const before = await sbx.runCode(SHOW_ENV)
      const during = await sbx.runCode(SHOW_ENV, { envs: { RUN_VAR: 'r', GLOBAL_VAR: 'override' } })
      const after = await sbx.runCode(SHOW_ENV)
      return { before: before.logs.stdout, during: during.logs.stdout, after: after.logs.stdout }
    },
  ],

  'interpreter/env-vars/sandbox-global': [
    { envs: { GLOBAL_VAR: 'g' }, secure: true },
    async (sbx) => {
      // Secure: envd's /envs needs the token, which only the run's own X-Access-Token can supply.
      const byDefault = await sbx.runCode(SHOW_ENV)
      const context = await sbx.createCodeContext()
      const created = await sbx.runCode(SHOW_ENV, { context })
      await sbx.restartCodeContext(context)
      const restarted = await sbx.runCode(SHOW_ENV, { context })
      const bash = await sbx.runCode('echo "$GLOBAL_VAR"', { language: 'bash' })
      return {
        default: byDefault.logs.stdout,
        created: created.logs.stdout,
        restarted: restarted.logs.stdout,
        bash: bash.logs.stdout,
      }
    },
  ],

  'interpreter/interrupt/timeout-then-run': [
    {},
    async (sbx) => {
      let start = performance.now()
      let raised = null
      let message = ''
      try {
        await sbx.runCode(SLEEP, { timeoutMs: 3000 })
      } catch (e) {
        if (!(e instanceof TimeoutError)) throw e
        raised = e.constructor.name
        message = e.message
      }
      const raisedAfter = (performance.now() - start) / 1000
      trace(`first run ended: ${raised}`)
      start = performance.now()
      const after = await sbx.runCode('1+1')
      const afterElapsed = (performance.now() - start) / 1000
      const sleepCompleted = await sbx.runCode("'finished_sleeping' in globals()")
      return {
        raised,
        message,
        raised_after_s: raisedAfter,
        after: after.text ?? null,
        after_error: errorOf(after.error),
        after_elapsed_s: afterElapsed,
        sleep_completed: sleepCompleted.text ?? null,
      }
    },
  ],

  'interpreter/contexts/concurrent': [
    {},
    async (sbx) => {
      const contexts = { a: await sbx.createCodeContext(), b: await sbx.createCodeContext() }
      const run = async (who) => {
        const start = performance.now() / 1000
        const execution = await sbx.runCode(concurrentCode(who), { context: contexts[who] })
        return { stdout: execution.logs.stdout, error: errorOf(execution.error), client: [start, performance.now() / 1000] }
      }
      const [a, b] = await Promise.all([run('a'), run('b')])
      return { runs: { a, b } }
    },
  ],

  'interpreter/languages/javascript': [LANGUAGE_CREATE, (sbx) => languageScenario(sbx, 'javascript')],
  'interpreter/languages/typescript': [LANGUAGE_CREATE, (sbx) => languageScenario(sbx, 'typescript')],
  'interpreter/languages/r': [LANGUAGE_CREATE, (sbx) => languageScenario(sbx, 'r')],
  'interpreter/languages/java': [LANGUAGE_CREATE, (sbx) => languageScenario(sbx, 'java')],
  'interpreter/languages/bash': [LANGUAGE_CREATE, (sbx) => languageScenario(sbx, 'bash')],

  'interpreter/languages/unknown': [
    {},
    async (sbx) => {
      try {
        await sbx.runCode('1', { language: UNKNOWN_LANGUAGE })
        return { raised: null, message: '' }
      } catch (e) {
        if (!(e instanceof SandboxError)) throw e
        return { raised: e.constructor.name, message: e.message }
      }
    },
  ],

  'interpreter/network/private-traffic': [
    { network: { allowPublicTraffic: false } },
    async (sbx) => {
      const token = sbx.trafficAccessToken
      const health = `https://${sbx.getHost(49999)}/health`
      const without = await fetch(health, { signal: AbortSignal.timeout(30000) })
      const withoutBody = await without.text()
      const withToken = await fetch(health, {
        headers: { 'E2B-Traffic-Access-Token': token ?? '' },
        signal: AbortSignal.timeout(30000),
      })
      const withBody = await withToken.text()
      const run = await sbx.runCode('1+1') // the client sends the token itself, on the contexts calls too
      const context = await sbx.createCodeContext()
      await sbx.runCode('marker = 1', { context })
      const idsBefore = (await sbx.listCodeContexts()).map((c) => c.id).sort()
      const refused = {}
      for (const [name, [method, path]] of Object.entries(BARE_CONTEXTS)) {
        const answer = await fetch(`https://${sbx.getHost(49999)}${path.replace('{id}', context.id)}`, {
          method,
          headers: { 'Content-Type': 'application/json' },
          body: name === 'create' ? '{}' : undefined,
          signal: AbortSignal.timeout(30000),
        })
        refused[name] = { status: answer.status, body: await answer.text() }
      }
      trace('contexts calls without the token sent')
      const idsAfter = (await sbx.listCodeContexts()).map((c) => c.id).sort()
      const kept = await sbx.runCode('marker', { context })
      await sbx.restartCodeContext(context)
      const restarted = await sbx.runCode('marker', { context })
      await sbx.removeCodeContext(context)
      return {
        has_token: Boolean(token),
        without: without.status,
        without_body: withoutBody,
        with: withToken.status,
        with_body: withBody,
        run: run.text ?? null,
        contexts_without: refused,
        listed: idsBefore.includes(context.id),
        unchanged_without: JSON.stringify(idsAfter) === JSON.stringify(idsBefore),
        kept_without: kept.text ?? null,
        restarted_error: restarted.error ? restarted.error.name : null,
        removed: (await sbx.listCodeContexts()).every((c) => c.id !== context.id),
      }
    },
  ],
}

async function languageScenario(sbx, language) {
  const steps = LANGUAGES[language]
  const atStart = (await sbx.listCodeContexts()).map((c) => ({ language: c.language, cwd: c.cwd }))
  const run = async (step, options = {}) =>
    executionOf(await sbx.runCode(steps[step], options.context ? options : { language, ...options }))
  const hello = await run('hello')
  trace('first run')
  await run('set')
  const found = { at_start: atStart, hello, kept: await run('get'), cwd: await run('cwd') }
  found.env = {
    before: await run('env'),
    during: await run('env', { envs: { RUN_VAR: LANGUAGES._run_value, GLOBAL_VAR: 'override' } }),
    after: await run('env'),
  }
  found.error = await run('error')
  found.after_error = await run('get')
  found.extra = await run('extra')
  const context = await sbx.createCodeContext({ cwd: '/tmp', language })
  trace(`context ${context.id}`)
  found.created = { language: context.language, cwd: context.cwd }
  found.context_cwd = await run('cwd', { context })
  found.context_get = await run('get', { context }) // its own kernel: nothing of the default's state
  found.listed = (await sbx.listCodeContexts())
    .filter((c) => c.id === context.id)
    .map((c) => ({ language: c.language, cwd: c.cwd }))
  await sbx.removeCodeContext(context)
  return found
}

async function main() {
  const [name] = process.argv.slice(2)
  const entry = Object.hasOwn(scenarios, name) ? scenarios[name] : undefined
  if (!entry) throw new Error(`unknown scenario ${JSON.stringify(name)}; known: ${Object.keys(scenarios).join(', ')}`)
  const [create, run] = entry
  current = name
  trace('start')
  const sbx = await Sandbox.create(create)
  let result
  try {
    trace(`created ${sbx.sandboxId}`)
    result = await run(sbx)
  } finally {
    await sbx.kill()
  }
  trace('done')
  // Exit once the result is written: after an error answer runCode throws without clearing
  // its request timer, which would keep node alive for requestTimeoutMs (60 s) doing nothing.
  process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0))
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
