// E2B's own JavaScript SDK (the `e2b` package from npm, unmodified) against
// a Cairn daemon, configured only by E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY; run with node's test runner by crates/cli/tests/e2b_sdk.rs.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, NotFoundError } from 'e2b'

const made = []
after(async () => {
  for (const sb of made) await Sandbox.kill(sb.sandboxId).catch(() => {})
})

async function create(opts = {}) {
  const sb = await Sandbox.create({ timeoutMs: 300_000, ...opts })
  made.push(sb)
  return sb
}

test('commands run with env and cwd, and a failure throws with its exit code', async () => {
  const sb = await create({ envs: { GREETING: 'hello' }, metadata: { suite: 'js' } })
  const r = await sb.commands.run('echo $GREETING; pwd; echo oops >&2')
  assert.equal(r.exitCode, 0)
  assert.deepEqual(r.stdout.trim().split('\n'), ['hello', '/workspace'])
  assert.equal(r.stderr, 'oops\n')
  assert.equal((await sb.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  await assert.rejects(sb.commands.run('echo partial; exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
  const chunks = []
  await sb.commands.run('for i in 1 2 3; do echo line$i; sleep 0.1; done', { onStdout: (d) => chunks.push(d) })
  assert.equal(chunks.join(''), 'line1\nline2\nline3\n')
})

test('background commands are listed and killed', async () => {
  const sb = await create()
  const h = await sb.commands.run('sleep 60', { background: true })
  const pids = (await sb.commands.list()).map((p) => p.pid)
  assert.ok(pids.includes(h.pid), `${h.pid} in ${pids}`)
  assert.equal(await sb.commands.kill(h.pid), true)
  await assert.rejects(h.wait())
})

test('files go in and out, binary included, and directories list', async () => {
  const sb = await create()
  const bytes = new Uint8Array(3 << 20).map((_, i) => (i * 7) % 256)
  await sb.files.write('/workspace/data/blob.bin', bytes.buffer)
  const back = await sb.files.read('/workspace/data/blob.bin', { format: 'bytes' })
  assert.equal(Buffer.compare(Buffer.from(back), Buffer.from(bytes)), 0)
  await sb.files.write('/workspace/note.txt', 'from js')
  assert.equal(await sb.files.read('/workspace/note.txt'), 'from js')
  const names = (await sb.files.list('/workspace')).map((e) => e.name)
  assert.ok(names.includes('data') && names.includes('note.txt'), names.join(','))
  assert.equal(await sb.files.exists('/workspace/missing'), false)
  await assert.rejects(sb.files.read('/workspace/missing'), NotFoundError)
})

test('sandboxes are listed by metadata, paused, connected to and killed', async () => {
  const tag = `js-${Date.now()}`
  const sb = await create({ metadata: { run: tag } })
  const page = Sandbox.list({ query: { metadata: { run: tag } } })
  const found = await page.nextItems()
  assert.deepEqual(found.map((s) => s.sandboxId), [sb.sandboxId])
  await sb.files.write('/workspace/kept.txt', 'across a pause')
  await sb.pause()
  const again = await Sandbox.connect(sb.sandboxId)
  assert.equal(await again.files.read('/workspace/kept.txt'), 'across a pause')
  assert.equal(await Sandbox.kill(sb.sandboxId), true)
  assert.equal(await Sandbox.kill(sb.sandboxId), false)
})

test('a directory watch streams changes as they happen, recursively, until stopped', async () => {
  const sb = await create()
  await sb.files.makeDir('/workspace/watched')
  const events = []
  const handle = await sb.files.watchDir('/workspace/watched', (e) => events.push(`${e.type}:${e.name}`), { recursive: true })
  await sb.files.write('/workspace/watched/a.txt', 'x')
  await sb.commands.run('mkdir -p /workspace/watched/sub && echo y > /workspace/watched/sub/b.txt && mv /workspace/watched/a.txt /workspace/watched/c.txt && rm /workspace/watched/c.txt')
  const want = ['create:a.txt', 'write:a.txt', 'create:sub', 'create:sub/b.txt', 'rename:a.txt', 'create:c.txt', 'remove:c.txt']
  const deadline = Date.now() + 15_000
  while (!want.every((w) => events.includes(w)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100))
  assert.deepEqual(want.filter((w) => !events.includes(w)), [], `events seen: ${events.join(', ')}`)
  await handle.stop()
  const seen = events.length
  await sb.files.write('/workspace/watched/after-stop.txt', 'z')
  await new Promise((r) => setTimeout(r, 500))
  assert.equal(events.length, seen, `no event after stop: ${events.slice(seen).join(', ')}`)
  // A missing directory is refused with the SDK's error.
  await assert.rejects(sb.files.watchDir('/workspace/nope', () => {}), NotFoundError)
})
