// Regenerates the corpus's NAME.expected.json: what the published dsh
// packages make of each log on their resume path.
//
//   node corpus.mjs REFERENCE_DIR LOG.jsonl...
//
// REFERENCE_DIR is the npm install of tools/reference/package.json; Node 22+
// is needed (the JSONL package imports node:zlib's Zstandard functions).
// Prints one JSON object per log, in argument order: {log, expected}.
//
// Each log is copied, byte for byte, into a fresh sessions root at the path
// the JSONL backend's own `locate()` gives for its header (dsh checks that the
// path and the header agree), then loaded with `sessionPersistence.load(id)`:
// the JSONL reader, format and vocabulary checks, legacy upgrades, crash
// repair (committed to the file) and session validation. What load() returns
// is then folded with dsh-session's `Session`, once for the whole log and once
// per model request (see `requestBoundaries`).
import { createRequire } from 'node:module'
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { basename, dirname, join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { foldedState } from './session-state.mjs'

const [referenceDir, ...logs] = process.argv.slice(2)
if (!referenceDir) {
  process.stderr.write('usage: corpus.mjs REFERENCE_DIR LOG.jsonl...\n')
  process.exit(2)
}
const require = createRequire(join(referenceDir, 'package.json'))
const load = (specifier) => import(pathToFileURL(require.resolve(specifier)).href)
const { Context } = await load('@deepseek-ai/cordis')
const { Session, SessionStore } = await load('@deepseek-ai/dsh-session')
const { JsonlSessionPersistence } = await load('@deepseek-ai/dsh-session-persistence-jsonl')

const ROOT_PLACEHOLDER = '<sessions-root>'

// The README's categories. A SessionPersistenceCorruptionError is the
// coordinator's wrapper for a failed legacy upgrade or session validation;
// any other error the backend's loadStored() throws is the JSONL reader
// refusing the bytes.
function category(error, fromStorage) {
  if (error?.name === 'SessionFormatUnsupportedError') return 'unsupported-format'
  if (error?.name === 'SessionPersistenceCorruptionError') return 'invalid-log'
  return fromStorage ? 'corrupt-storage' : 'other'
}

function describe(error, root) {
  if (error === undefined || error === null) return null
  return {
    name: error.name ?? typeof error,
    type: error.constructor?.name ?? typeof error,
    message: String(error.message ?? error).replaceAll(root, ROOT_PLACEHOLDER),
    cause: describe(error.cause, root),
  }
}

function stateOf(id, events, meta) {
  return foldedState(Session.create(id, events, meta))
}

function turnsOf(events) {
  const turns = []
  for (const { type, data } of events) {
    if (type === 'turn/start') turns.push({ turn: data.turn, reason: null, steps: 0 })
    const open = turns.findLast((entry) => entry.turn === data?.turn)
    if (type === 'turn/end' && open) open.reason = data.reason
    if (type === 'step/start' && open) open.steps += 1
  }
  return turns
}

// The README's request boundary: a step's first attempt starts at its first
// assistant/chunk (or its assistant/message when it logged no chunks), a
// further attempt at the first assistant/chunk after a `finish` chunk.
function requestBoundaries(events) {
  const steps = new Map()
  const boundaries = []
  for (const event of events) {
    if (event.type !== 'assistant/chunk' && event.type !== 'assistant/message') continue
    const { turn, step } = event.data
    const key = `${turn}/${step}`
    const state = steps.get(key) ?? { attempts: 0, finished: false }
    steps.set(key, state)
    const chunk = event.type === 'assistant/chunk'
    if (state.attempts === 0 || (chunk && state.finished)) {
      state.attempts += 1
      boundaries.push({ turn, step, attempt: state.attempts, boundarySeq: event.seq })
    }
    if (chunk) state.finished = event.data.chunk.type === 'finish'
  }
  return boundaries
}

function requestsOf(id, events, meta) {
  return requestBoundaries(events).map((boundary) => {
    const prefix = stateOf(id, events.slice(0, boundary.boundarySeq), meta)
    return { ...boundary, header: prefix.requestHeader, context: prefix.requestContext, messages: prefix.derivedMessages }
  })
}

function headerOf(bytes) {
  try {
    const header = JSON.parse(bytes.subarray(0, bytes.indexOf(10)).toString('utf8'))
    if (typeof header?.id === 'string' && header.id !== '') return header
  } catch { /* a log without a header line is refused by the reader itself */ }
  return undefined
}

async function expectedOf(log) {
  const original = readFileSync(log)
  // Without a usable header the log is placed under its file name; the reader
  // refuses it before the id or the path matter.
  const header = headerOf(original) ?? { id: basename(log, '.jsonl') }
  const root = mkdtempSync(join(tmpdir(), 'dsh-corpus-'))
  const ctx = new Context()
  try {
    await ctx.plugin(SessionStore)
    await ctx.plugin(JsonlSessionPersistence, { root, compression: 'none' })
    const backend = ctx.get('sessionPersistence')
    const path = backend.locate(header).path
    mkdirSync(dirname(path), { recursive: true })
    copyFileSync(log, path)

    // Observe the backend seam the coordinator calls: which failures are the
    // reader's, and what crash repair truncates and appends.
    let storageError
    let repair = null
    const loadStored = backend.loadStored.bind(backend)
    backend.loadStored = (...args) => loadStored(...args).catch((error) => { storageError = error; throw error })
    const commitRepair = backend.commitRepair.bind(backend)
    backend.commitRepair = async (meta, tornMarker, closers) => {
      await commitRepair(meta, tornMarker, closers)
      const kept = tornMarker?.truncateTo ?? original.length
      repair = {
        droppedBytes: original.length - kept,
        droppedText: original.subarray(kept).toString('utf8'),
        closerCount: closers.length,
        closers,
        repairedLog: readFileSync(path, 'utf8'),
      }
    }

    let inspection
    try {
      inspection = await backend.load(header.id)
    } catch (error) {
      return refused({ ...describe(error, root), category: category(error, error === storageError) })
    }
    const { meta, events } = inspection
    const state = stateOf(meta.id, events, meta)
    return {
      accepted: true,
      error: null,
      sessionHeader: meta,
      eventCount: events.length,
      ...state,
      turns: turnsOf(events),
      requests: requestsOf(meta.id, events, meta),
      repair,
    }
  } finally {
    await ctx.fiber.dispose()
    rmSync(root, { recursive: true, force: true })
  }
}

function refused(error) {
  return {
    accepted: false, error, sessionHeader: null, eventCount: null, surfaceNodes: null,
    replaceGeneration: null, derivedMessages: null, requestHeader: null, requestContext: null,
    turns: null, requests: null, repair: null,
  }
}

for (const log of logs) {
  const line = JSON.stringify({ log, expected: await expectedOf(log) }) + '\n'
  // await each write: a pipe is asynchronous and process.exit() drops pending output
  await new Promise((resolve) => process.stdout.write(line, resolve))
}
process.exit(0)
