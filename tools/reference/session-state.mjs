// What a dsh-session `Session` derives from its log, in the corpus's field
// names: shared by driver.mjs and corpus.mjs.
export function foldedState(session) {
  return {
    surfaceNodes: [...session.surface.nodes],
    replaceGeneration: session.surface.replaceGeneration,
    derivedMessages: session.deriveMessages(),
    requestHeader: session.requestHeader() ?? null,
    requestContext: session.requestContext() ?? null,
  };
}
