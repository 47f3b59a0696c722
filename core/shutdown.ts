// Graceful shutdown: wait for SIGTERM or SIGINT, then run `close` (stop accepting, finish in-flight
// work, flush audit) once. A second signal does not interrupt the first close.
export function runUntilSignal(close: () => Promise<void>): Promise<void> {
  return new Promise<void>((done) => {
    const stop = () => {
      process.off('SIGTERM', stop);
      process.off('SIGINT', stop);
      process.on('SIGTERM', () => {});
      process.on('SIGINT', () => {});
      close().then(done, done);
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
  });
}
