/**
 * A request a later front end relayed to the first, dressed as the uWebSockets.js request and
 * response the first front end's pipeline reads and writes: the same checks, routes and
 * answers as a request it received itself. Only the methods that pipeline uses exist; each
 * writes into a message back to the front end that holds the client's connection.
 *
 * A streamed answer (a snapshot download) is flow-controlled: past STREAM_WINDOW_BYTES sent
 * and not yet written to the client's socket, `tryEnd` reports the socket full, and
 * `onWritable` fires once the other front end says it drained.
 */
import type { HttpRequest, HttpResponse } from 'uWebSockets.js';
import type { FromFrontEnd, ToFrontEnd } from './protocol.js';

type RequestMessage = Extract<FromFrontEnd, { t: 'request' }>;

const STREAM_WINDOW_BYTES = 4 * 1024 * 1024;

export class RelayedRequest {
  constructor(private readonly message: RequestMessage) {}

  getCaseSensitiveMethod(): string {
    return this.message.method;
  }

  getUrl(): string {
    return this.message.url;
  }

  getQuery(): string | undefined {
    return this.message.query === '' ? undefined : this.message.query;
  }

  getHeader(name: string): string {
    const headers = this.message.headers;
    for (let i = 0; i < headers.length; i += 2)
      if (headers[i] === name) return headers[i + 1] ?? '';
    return '';
  }

  forEach(visit: (name: string, value: string) => void): void {
    const headers = this.message.headers;
    for (let i = 0; i < headers.length; i += 2) visit(headers[i] ?? '', headers[i + 1] ?? '');
  }

  asRequest(): HttpRequest {
    return this as unknown as HttpRequest;
  }
}

/**
 * A dev-relay WebSocket held by another front end, as the relay (src/webhooks/relay.ts) uses
 * one: what it sends goes there in a message.
 */
export class RelayedSocket {
  constructor(
    private readonly id: number,
    private readonly userData: unknown,
    private readonly post: (message: ToFrontEnd) => void,
  ) {}

  getUserData(): unknown {
    return this.userData;
  }

  /** Not known here: the other front end drops a listener that falls too far behind. */
  getBufferedAmount(): number {
    return 0;
  }

  send(text: string): void {
    this.post({ t: 'wsSend', id: this.id, text });
  }

  end(code: number, reason: string): void {
    this.post({ t: 'wsEnd', id: this.id, code, reason });
  }
}

export class RelayedResponse {
  private status: string | null = '200 OK';
  private headers: string[] = [];
  private headSent = false;
  private ended = false;
  private offset = 0;
  private unacknowledged = 0;
  private abortHandler: (() => void) | null = null;
  private writableHandler: ((offset: number) => boolean) | null = null;

  /** Set by the first front end: a relayed upgrade was accepted with this user data. */
  onUpgrade: ((userData: unknown) => void) | null = null;

  constructor(
    private readonly message: RequestMessage,
    private readonly send: (message: ToFrontEnd) => void,
    private readonly finished: () => void,
  ) {}

  asResponse(): HttpResponse {
    return this as unknown as HttpResponse;
  }

  cork(step: () => void): this {
    step();
    return this;
  }

  writeStatus(status: string): this {
    this.status = status;
    return this;
  }

  writeHeader(name: string, value: string): this {
    this.headers.push(name, value);
    return this;
  }

  end(body: string | ArrayBuffer | Uint8Array = '', closeConnection = false): this {
    this.part(body, 0, true, closeConnection);
    return this;
  }

  /** No body at all (a 204): `total` -1 says so. */
  endWithoutBody(): this {
    this.part('', -1, true, false);
    return this;
  }

  /** Sends part of a body of `total` bytes; "full" while too much is not yet on the socket. */
  tryEnd(chunk: ArrayBuffer | Uint8Array, total: number): [boolean, boolean] {
    const bytes = chunk.byteLength;
    this.offset += bytes;
    this.unacknowledged += bytes;
    const done = this.offset >= total;
    if (bytes > 0 || done) this.part(chunk, total, done, false);
    return [this.unacknowledged < STREAM_WINDOW_BYTES, done];
  }

  getWriteOffset(): number {
    return this.offset;
  }

  onWritable(handler: (offset: number) => boolean): this {
    this.writableHandler = handler;
    return this;
  }

  onAborted(handler: () => void): this {
    this.abortHandler = handler;
    return this;
  }

  /** The whole body, as one last chunk, on the next turn (as uWS would call it). */
  onData(handler: (chunk: ArrayBuffer, isLast: boolean) => void): this {
    const body = this.message.body ?? new ArrayBuffer(0);
    setImmediate(() => {
      if (!this.ended) handler(body, true);
    });
    return this;
  }

  close(): this {
    if (!this.ended) {
      this.ended = true;
      this.send({ t: 'cut', id: this.message.id });
      this.finished();
    }
    return this;
  }

  /** The dev relay accepted a relayed upgrade: the other front end opens the socket. */
  upgrade(userData: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.onUpgrade?.(userData);
    this.send({ t: 'upgrade', id: this.message.id, userData });
    this.finished();
  }

  getRemoteAddress(): ArrayBuffer {
    return this.message.address;
  }

  /** The client went away: what uWS would report through `onAborted`. */
  aborted(): void {
    if (this.ended) return;
    this.ended = true;
    this.finished();
    this.abortHandler?.();
  }

  /** `bytes` more of a streamed answer reached the client's socket. */
  drained(bytes: number): void {
    this.unacknowledged -= bytes;
    const handler = this.writableHandler;
    if (handler === null || this.ended || this.unacknowledged >= STREAM_WINDOW_BYTES) return;
    this.writableHandler = null;
    if (!handler(this.offset)) this.writableHandler = handler;
  }

  private part(
    body: string | ArrayBuffer | Uint8Array,
    total: number,
    end: boolean,
    close: boolean,
  ): void {
    if (this.ended) return;
    const head = !this.headSent;
    this.headSent = true;
    // A copy: the sender may reuse its buffer (a file stream's chunk), and a copy transfers.
    const copy = typeof body === 'string' ? body : new Uint8Array(body).slice().buffer;
    this.send({
      t: 'answer',
      id: this.message.id,
      status: head ? this.status : null,
      headers: head ? this.headers : null,
      body: copy,
      total,
      end,
      close,
    });
    if (end) {
      this.ended = true;
      this.finished();
    }
  }
}
