// One run at a time: a call while a run is in progress makes it run once more when it ends (calls
// coalesce), and a run that returns true ("there is more") runs again too. Used wherever a nudge
// triggers a read or a write: the pullers, the publisher, the SSE senders, the store reload.

export function coalesced(
  // biome-ignore lint/suspicious/noConfusingVoidType: a run that returns nothing means "no more"
  run: () => Promise<boolean | void>,
  stopped: () => boolean = () => false,
): () => Promise<void> {
  let running: Promise<void> | null = null;
  let again = false;
  return () => {
    if (running) {
      again = true;
      return running;
    }
    running = (async () => {
      // biome-ignore lint/suspicious/noConfusingVoidType: what run() returned
      let more: boolean | void;
      do {
        again = false;
        more = await run();
      } while ((again || more === true) && !stopped());
    })().finally(() => {
      running = null;
    });
    return running;
  };
}
