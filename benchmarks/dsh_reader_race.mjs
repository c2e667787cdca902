// dsh 0.2.1rc2's own reader, timed: read every session under ROOT REPEAT
// times (open, read, close, fold the surface, derive the messages), the
// work `dsh-pipeline inspect` does. Prints {"events", "seconds"}.
//
//   node22 dsh_reader_race.mjs MODULES ROOT REPEAT ID...
//
// MODULES is the node_modules tree cut out of the runtime wheel
// (tests/oracle/extract.py). The sessions are read in turn, so dsh's
// two-entry memo of decoded logs never serves a repeat (use > 2 sessions).
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'

const [modules, root, repeatText, ...ids] = process.argv.slice(2)
const require = createRequire(join(modules, '..', 'package.json'))
const load = (specifier) => import(pathToFileURL(require.resolve(specifier)).href)
const { Context } = await load('@deepseek-ai/cordis')
const jsonl = await load('@deepseek-ai/dsh-session-persistence-jsonl')
const { foldSurface, deriveEventMessage } = await load('@deepseek-ai/dsh-session')
const { currentSessionMessageProjections } = await load('@deepseek-ai/dsh-session-format-catalog/message-projections')

const ctx = new Context()
const fiber = ctx.plugin(jsonl, { root, compression: 'zstd' })
if (fiber?.await) await fiber.await()
const store = ctx.get('sessionPersistence')
let events = 0
const start = process.hrtime.bigint()
for (let round = 0; round < Number(repeatText); round++) {
  for (const id of ids) {
    const handle = await store.open(id, 'read')
    const slice = await handle.read()
    const fold = foldSurface(slice.events, currentSessionMessageProjections)
    for (const seq of fold.nodes) deriveEventMessage(slice.events[seq], fold.projectedMessages)
    events += slice.events.length
    await handle.close()
  }
}
const seconds = Number(process.hrtime.bigint() - start) / 1e9
process.stdout.write(JSON.stringify({ events, seconds }) + '\n')
process.exit(0)
