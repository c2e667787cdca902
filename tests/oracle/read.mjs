// dsh 0.2.1-rc.2's own session reader as a test oracle.
//
//   node22 read.mjs MODULES ROOT [ID ...]
//
// MODULES is the node_modules folder extracted, unmodified, from the 0.2.1rc2
// runtime executable (tests/oracle/extract.py); ROOT is a sessions root laid
// out as dsh lays it out: ROOT/<projectKey(cwd)>/<encodeSegment(id)>/
// session(.vN).jsonl.zstd. dsh checks that path against the header's cwd and
// id, so files must sit where dsh would have written them. Without IDs every
// session directory under ROOT is read (directory names decoded by the
// inverse of dsh's encodeSegment). Nothing under ROOT is written: only read
// handles are opened, and a v0/v3 log is migrated in memory.
//
// Output: one JSON object per session, one per line, in argument order:
//   {id, ok:false, stage:"read"|"derive", category, name, message, cause?}
//   {id, ok:true, formatStatus, header, inheritedEventCount, eventState,
//    events, surface:{nodes, replacements}, messages, requestHeader,
//    requestContext, systemPrompt:{nodes, text}, restore:{...}}
// formatStatus is dsh's list() verdict (current / migration-required / ...).
//
// dsh functions used (all exported, all called as shipped):
// - @deepseek-ai/dsh-session-persistence-jsonl `apply`, loaded into a bare
//   @deepseek-ai/cordis `Context` with {root, compression:"zstd"}: the service
//   `sessionPersistence`; `list()` gives formatStatus; `open(id,"read")` then
//   `handle.read()` gives `{eventState, events}` (v0..v3 migrated in memory by
//   the dsh-session-format-v*-to-v* chain); `handle.header`,
//   `handle.inheritedEventCount`.
// - @deepseek-ai/dsh-session `foldSurface(events, projections)`: the surface
//   fold (append / replace ops, source-seq and replacement checks) -> nodes,
//   replacements, projectedMessages.
// - @deepseek-ai/dsh-session `deriveEventMessage(event, projectedMessages)`
//   over the surface nodes, dropping nulls: exactly Session.deriveMessages(),
//   i.e. the `messages` the agent loop's buildRequest() sends.
// - @deepseek-ai/dsh-session `foldRequestHeader(events)`: the latest canonical
//   request/header {config, adapterDefaults?, tools?}.
// - @deepseek-ai/dsh-session-format-catalog/message-projections
//   `currentSessionMessageProjections` (the image/offload projection), the
//   projections dsh's own verifier and restore paths pass.
// - @deepseek-ai/dsh-session `Session.fromRestore(id, events, header,
//   inheritedEventCount, eventState, projections)`: the restore a resuming
//   runtime performs (header + inherited-cut checks, incremental surface
//   validation); `restore` reports its deriveMessages() agreement,
//   requestContext(), toolHistory() and the events it appends in memory
//   (a `session/end-seed {}`; their `time` is dropped).
// - systemPrompt mirrors dsh-agent-loop's SystemPromptProjection.systemNodes()
//   (not exported): the surviving system/message nodes {seq, text}, text ""
//   for empty content and the single text block otherwise; `text` is the
//   latest non-empty one (what the loop compares a newly rendered prompt with).
//
// Categories come from dsh's error classes (dsh-session-persistence):
//   SessionPersistenceCorruptionError -> "corrupt-storage"
//   SessionFormatUnsupportedError     -> "unsupported-format"
//   SessionPersistenceNotFoundError   -> "not-found"
//   anything else (dsh throws a plain Error, e.g. the id/path identity
//   check, layout refusals, or any failure of the surface fold/restore) ->
//   "invalid-log"
import { createRequire } from 'node:module'
import { readdirSync } from 'node:fs'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'

const [modules, root, ...requested] = process.argv.slice(2)
if (!modules || !root) {
  process.stderr.write('usage: read.mjs MODULES ROOT [ID ...]\n')
  process.exit(2)
}
// Resolve bare specifiers as if imported from MODULES/../package.json, so the
// module instances are the ones the packages import from each other.
const require = createRequire(join(modules, '..', 'package.json'))
const load = (specifier) => import(pathToFileURL(require.resolve(specifier)).href)
const { Context } = await load('@deepseek-ai/cordis')
const jsonl = await load('@deepseek-ai/dsh-session-persistence-jsonl')
const { foldSurface, deriveEventMessage, foldRequestHeader, Session } = await load('@deepseek-ai/dsh-session')
const { currentSessionMessageProjections } = await load('@deepseek-ai/dsh-session-format-catalog/message-projections')

const CATEGORY = {
  SessionPersistenceCorruptionError: 'corrupt-storage',
  SessionFormatUnsupportedError: 'unsupported-format',
  SessionPersistenceNotFoundError: 'not-found',
}

function failure(id, stage, error) {
  const name = error?.name ?? typeof error
  const out = {
    id, ok: false, stage,
    category: stage === 'read' ? (CATEGORY[name] ?? 'invalid-log') : 'invalid-log',
    name,
    message: String(error?.message ?? error),
  }
  if (error?.cause !== undefined) out.cause = String(error.cause?.message ?? error.cause)
  return out
}

// Inverse of dsh's encodeSegment: `~XXXX` is one UTF-16 code unit.
function decodeSegment(segment) {
  return segment.replace(/~([0-9A-F]{4})/g, (_, hex) => String.fromCharCode(parseInt(hex, 16)))
}

function sessionIds() {
  const ids = []
  for (const project of readdirSync(root, { withFileTypes: true })) {
    if (!project.isDirectory()) continue
    for (const dir of readdirSync(join(root, project.name), { withFileTypes: true })) {
      if (dir.isDirectory()) ids.push(decodeSegment(dir.name))
    }
  }
  return ids.sort()
}

function textOf(message) {
  const [block] = message.content
  return message.content.length === 1 && block?.type === 'text' ? block.text : undefined
}

function derive(id, handle, slice) {
  const events = slice.events
  const fold = foldSurface(events, currentSessionMessageProjections)
  const messages = []
  for (const seq of fold.nodes) {
    const message = deriveEventMessage(events[seq], fold.projectedMessages)
    if (message) messages.push(message)
  }
  const systemNodes = []
  for (const seq of fold.nodes) {
    const event = events[seq]
    if (event.type !== 'system/message') continue
    systemNodes.push({ seq, text: event.data.message.content.length === 0 ? '' : textOf(event.data.message) ?? null })
  }
  const latest = systemNodes.findLast((node) => node.text !== '') ?? systemNodes[0]
  let requestContext = null
  for (const event of events) if (event.type === 'request/context') requestContext = event.data
  let restore
  try {
    const session = Session.fromRestore(id, events, handle.header, handle.inheritedEventCount, slice.eventState, currentSessionMessageProjections)
    const restored = session.deriveMessages()
    restore = {
      ok: true,
      messagesMatchFold: JSON.stringify(restored) === JSON.stringify(messages),
      requestContext: session.requestContext() ?? null,
      toolHistory: session.toolHistory(),
      appended: session.snapshotEvents(events.length).map(({ time, ...rest }) => rest),
    }
  } catch (error) {
    restore = failure(id, 'restore', error)
    delete restore.id
  }
  return {
    surface: { nodes: fold.nodes, replacements: fold.replacements },
    messages,
    requestHeader: foldRequestHeader(events) ?? null,
    requestContext,
    systemPrompt: { nodes: systemNodes, text: latest?.text ?? null },
    restore,
  }
}

const ctx = new Context()
const fiber = ctx.plugin(jsonl, { root, compression: 'zstd' })
await fiber.await?.()
const store = ctx.get('sessionPersistence')

const status = new Map()
// list() fails for the whole root when any one session is unlistable (e.g. a
// .v4 file whose header says v0); formatStatus is then null everywhere and
// the reason goes to stderr.
try {
  for (const entry of await store.list()) status.set(entry.header.id, entry.formatStatus ?? null)
} catch (error) {
  process.stderr.write(`read.mjs: list() failed, formatStatus unavailable: ${String(error?.message ?? error)}\n`)
}

for (const id of requested.length > 0 ? requested : sessionIds()) {
  let result
  let handle
  let slice
  try {
    handle = await store.open(id, 'read')
    slice = await handle.read()
  } catch (error) {
    result = failure(id, 'read', error)
  }
  if (result === undefined) {
    try {
      result = {
        id, ok: true,
        formatStatus: status.get(id) ?? null,
        header: handle.header,
        inheritedEventCount: handle.inheritedEventCount,
        eventState: slice.eventState,
        events: slice.events,
        ...derive(id, handle, slice),
      }
    } catch (error) {
      result = failure(id, 'derive', error)
    }
  }
  try { await handle?.close() } catch { /* a read handle holds no lease */ }
  // await each write: a pipe is asynchronous and process.exit() drops pending output
  await new Promise((resolve) => process.stdout.write(JSON.stringify(result) + '\n', resolve))
}
process.exit(0)
