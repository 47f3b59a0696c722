import { crc32 } from 'node:zlib';

// WAL framing. A segment file is a 16-byte header then frames:
//
//   header:  "DVXWAL\0\0" (8) │ format version u32 LE (4) │ reserved (4)
//   frame:   payload length u32 LE (4) │ crc32(payload) u32 LE (4) │ payload (length bytes)
//
// A frame is valid when its length fits in what is left and its crc matches. The first frame that is
// not valid ends the readable log: on open, the tail is cut there (a torn write of the last batch).

export const MAGIC = Buffer.from('DVXWAL\0\0', 'latin1');
export const FORMAT_VERSION = 1;
export const HEADER_BYTES = 16;
export const FRAME_OVERHEAD = 8;
/** A single record larger than this is refused (and a length field beyond it is corruption). */
export const MAX_RECORD_BYTES = 16 * 1024 * 1024;

export function segmentHeader(): Buffer {
  const h = Buffer.alloc(HEADER_BYTES);
  MAGIC.copy(h, 0);
  h.writeUInt32LE(FORMAT_VERSION, 8);
  return h;
}

export function checkHeader(buf: Buffer): string | null {
  if (buf.length < HEADER_BYTES) return 'segment shorter than its header';
  if (!buf.subarray(0, 8).equals(MAGIC)) return 'bad magic';
  const version = buf.readUInt32LE(8);
  if (version !== FORMAT_VERSION) return `unsupported format version ${version}`;
  return null;
}

export function encodeFrame(payload: Buffer): Buffer {
  const frame = Buffer.allocUnsafe(FRAME_OVERHEAD + payload.length);
  frame.writeUInt32LE(payload.length, 0);
  frame.writeUInt32LE(crc32(payload), 4);
  payload.copy(frame, FRAME_OVERHEAD);
  return frame;
}

/** The frame of a JSON text, written straight into one buffer (no intermediate payload copy). */
export function encodeJsonFrame(json: string): Buffer {
  const length = Buffer.byteLength(json);
  const frame = Buffer.allocUnsafe(FRAME_OVERHEAD + length);
  frame.writeUInt32LE(length, 0);
  frame.write(json, FRAME_OVERHEAD, length, 'utf8');
  frame.writeUInt32LE(crc32(frame.subarray(FRAME_OVERHEAD)), 4);
  return frame;
}

/**
 * A group commit's frames, encoded into one buffer: each JSON text written straight into place and
 * its crc taken over the bytes just written. `lengths[i]` is `Buffer.byteLength(jsons[i])` and `bytes`
 * the batch's total including FRAME_OVERHEAD per frame (the caller already knows both, from the
 * ceiling check at append time).
 */
export function encodeJsonFrames(jsons: readonly string[], lengths: readonly number[], bytes: number): Buffer {
  const out = Buffer.allocUnsafeSlow(bytes);
  let at = 0;
  for (let i = 0; i < jsons.length; i++) {
    const length = lengths[i];
    const payload = at + FRAME_OVERHEAD;
    out.writeUInt32LE(length, at);
    out.write(jsons[i], payload, length, 'utf8');
    out.writeUInt32LE(crc32(out.subarray(payload, payload + length)), at + 4);
    at = payload + length;
  }
  return out;
}

export interface DecodedFrame {
  /** Offset of the frame in the buffer. */
  offset: number;
  /** Offset just past it. */
  next: number;
  payload: Buffer;
}

export interface DecodeResult {
  frames: DecodedFrame[];
  /** Where valid data ends (the start of the first invalid frame, or the end of the buffer). */
  validEnd: number;
  /** Why decoding stopped before the end, or null when it reached the end cleanly. */
  problem: string | null;
}

/** Decodes frames from `start` until the end of `buf` or the first torn or corrupt frame. */
export function decodeFrames(buf: Buffer, start: number, limit = Infinity): DecodeResult {
  const frames: DecodedFrame[] = [];
  let at = start;
  while (at < buf.length && frames.length < limit) {
    if (buf.length - at < FRAME_OVERHEAD) return { frames, validEnd: at, problem: `torn frame header at byte ${at}` };
    const length = buf.readUInt32LE(at);
    if (length > MAX_RECORD_BYTES)
      return { frames, validEnd: at, problem: `impossible frame length ${length} at byte ${at}` };
    if (buf.length - at - FRAME_OVERHEAD < length)
      return { frames, validEnd: at, problem: `torn frame at byte ${at} (${length} bytes announced)` };
    const payload = buf.subarray(at + FRAME_OVERHEAD, at + FRAME_OVERHEAD + length);
    if (crc32(payload) !== buf.readUInt32LE(at + 4))
      return { frames, validEnd: at, problem: `crc mismatch at byte ${at}` };
    frames.push({ offset: at, next: at + FRAME_OVERHEAD + length, payload });
    at += FRAME_OVERHEAD + length;
  }
  return { frames, validEnd: at, problem: null };
}
