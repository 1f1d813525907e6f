// presence.js: the browser client of presenced (WEB.md). One ES module, no dependencies, no build step.
//
//   import { PresenceClient } from "/presence.js";
//   const client = new PresenceClient({ servers: ["ws://a:7402", "ws://b:7402"], userId: "ann", token });
//   client.addEventListener("presence", (e) => console.log(e.detail));   // PresenceEvent, as JSON
//   await client.connect();
//   await client.join("lobby");
//
// The socket is the session's stream. When it breaks, the client resumes the session on the next server
// (backing off), so the server keeps its presence and state and nobody sees it leave; if the session was
// lost meanwhile, it opens a new one and joins its channels, restores its state and watches again.
// Events: "presence" and "status" (detail: the event), "connectionstate" (detail: the new state), and
// "snapshot" (detail: {channel, type, users}) once a whole (possibly paged) SNAPSHOT has arrived.

const TYPES = { message: "CHANNEL_TYPE_MESSAGE", stream: "CHANNEL_TYPE_STREAM" };
const STATUSES = { unknown: "USER_STATUS_UNKNOWN", online: "USER_STATUS_ONLINE", away: "USER_STATUS_AWAY",
                   busy: "USER_STATUS_BUSY", offline: "USER_STATUS_OFFLINE" };

/** Connection states, as in the Swift client. */
export const ConnectionState = Object.freeze({
  notInitialized: "notInitialized", connecting: "connecting", connected: "connected",
  reconnecting: "reconnecting", disconnected: "disconnected",
});

/** A call the server refused: `code` is the gRPC status name (NOT_FOUND...), `message` its text. */
export class PresenceError extends Error {
  constructor(code, message) {
    super(`${code}: ${message}`);
    this.name = "PresenceError";
    this.code = code;
    this.serverMessage = message;
  }
}

const channelType = (t) => TYPES[t ?? "message"] ?? t;
const userStatus = (s) => STATUSES[s] ?? s;
// Close codes after which trying again cannot help (WEB.md).
const FINAL_CLOSES = new Set([4001, 4003, 4400, 4409]);

export class PresenceClient extends EventTarget {
  /**
   * @param {{servers: string[], userId: string, token?: string, callTimeoutMs?: number,
   *          maxBackoffMs?: number, WebSocket?: typeof WebSocket}} options
   *   servers: WebSocket URLs of nodes ("ws://host:7402"; "/v1/ws" is added when the path is empty).
   */
  constructor({ servers, userId, token = "", callTimeoutMs = 10000, maxBackoffMs = 5000, WebSocket: WS } = {}) {
    super();
    if (!servers || servers.length === 0) throw new TypeError("servers: at least one node's ws:// URL");
    if (!userId) throw new TypeError("userId is required");
    this.servers = servers.map((s) => (new URL(s).pathname === "/" ? s.replace(/\/?$/, "/v1/ws") : s));
    this.userId = userId;
    this.token = token;
    this.callTimeoutMs = callTimeoutMs;
    this.maxBackoffMs = maxBackoffMs;
    this._WS = WS ?? globalThis.WebSocket;
    this._state = ConnectionState.notInitialized;
    this._server = 0;
    this._socket = null;
    this._sessionId = null;
    this._nextId = 0;
    this._calls = new Map();        // id -> {resolve, reject, timer}
    this._waiting = [];             // calls made while (re)connecting: sent once connected
    this._memory = { channels: new Map(), state: new Map(), watching: new Set(), status: null };
    this._restore = false;
    this._backoff = 100;
    this._retryTimer = null;
    this._firstOpen = null;
    this._pages = new Map();        // channel key -> users of a paged SNAPSHOT so far
  }

  /** Where the session stands (see ConnectionState). */
  get connectionState() { return this._state; }
  /** The session's id once open. */
  get sessionId() { return this._sessionId; }
  /** The server in use now. */
  get server() { return this.servers[this._server]; }

  /** Opens the session (resolves once it is open; rejects if the first server refuses it for good). */
  connect({ initialStatus } = {}) {
    if (this._state !== ConnectionState.notInitialized && this._state !== ConnectionState.disconnected) {
      return Promise.reject(new PresenceError("FAILED_PRECONDITION", "ALREADY_STARTED: connect() was already called"));
    }
    if (initialStatus) this._memory.status = userStatus(initialStatus);
    this._closing = false;
    this._setState(ConnectionState.connecting);
    return new Promise((resolve, reject) => {
      this._firstOpen = { resolve, reject };
      this._open();
    });
  }

  /** Closes the session (CloseSession: others see the user leave at once) and the socket. */
  async close() {
    this._closing = true;
    clearTimeout(this._retryTimer);
    if (this._state === ConnectionState.connected) {
      try { await this._call("CloseSession", {}); } catch (_) { /* the socket may be gone already */ }
    }
    this._socket?.close(1000);
    this._socket = null;
    this._sessionId = null;
    this._failAll(new PresenceError("CANCELLED", "the client was closed"));
    this._setState(ConnectionState.disconnected);
  }

  join(channel, { type = "message", withPresence = true } = {}) {
    const t = channelType(type);
    return this._call("Join", { channelName: channel, channelType: t, withPresence }).then((r) => {
      this._memory.channels.set(`${t}/${channel}`, { channel, type: t, withPresence });
      return r;
    });
  }

  leave(channel, { type = "message" } = {}) {
    const t = channelType(type);
    return this._call("Leave", { channelName: channel, channelType: t }).then((r) => {
      this._memory.channels.delete(`${t}/${channel}`);
      this._memory.state.delete(`${t}/${channel}`);
      return r;
    });
  }

  /** Sets keys of this user's state in a channel: `items` is {key: value, ...}. */
  setState(channel, items, { type = "message" } = {}) {
    const t = channelType(type);
    const list = Object.entries(items).map(([key, value]) => ({ key, value: String(value) }));
    return this._call("SetState", { channelName: channel, channelType: t, items: list }).then((r) => {
      const key = `${t}/${channel}`;
      this._memory.state.set(key, { ...(this._memory.state.get(key) ?? {}), ...items });
      return r;
    });
  }

  /** Removes keys (all of them when `keys` is empty). */
  removeState(channel, keys = [], { type = "message" } = {}) {
    const t = channelType(type);
    return this._call("RemoveState", { channelName: channel, channelType: t, keys }).then((r) => {
      const key = `${t}/${channel}`;
      if (keys.length === 0) this._memory.state.delete(key);
      else {
        const s = { ...(this._memory.state.get(key) ?? {}) };
        for (const k of keys) delete s[k];
        this._memory.state.set(key, s);
      }
      return r;
    });
  }

  getState(channel, user, { type = "message" } = {}) {
    return this._call("GetState", { channelName: channel, channelType: channelType(type), userId: user })
      .then((r) => r.state?.states ?? []);
  }

  /** One page of a channel's users (`page` from the previous answer's nextPage). */
  getOnlineUsers(channel, { type = "message", includeUserId = true, includeState = false, page = "" } = {}) {
    return this._call("GetOnlineUsers", { channelName: channel, channelType: channelType(type), includeUserId, includeState, page });
  }

  /** Every user of a channel, following the pages. */
  async allOnlineUsers(channel, { type = "message", includeState = false } = {}) {
    const users = [];
    let page = "";
    do {
      const r = await this.getOnlineUsers(channel, { type, includeState, page });
      users.push(...(r.users ?? []));
      page = r.nextPage ?? "";
    } while (page);
    return users;
  }

  getUserChannels(user) {
    return this._call("GetUserChannels", { userId: user }).then((r) => r.channels ?? []);
  }

  /** "online", "away", "busy", "offline" (or USER_STATUS_...). */
  setStatus(status) {
    const s = userStatus(status);
    return this._call("SetStatus", { status: s }).then((r) => { this._memory.status = s; return r; });
  }

  getUserStatuses(users) {
    return this._call("GetUserStatuses", { userIds: users }).then((r) => r.statuses ?? []);
  }

  /** Follows users' statuses ("status" events); answers their statuses now. */
  watch(users, unwatch = []) {
    return this._call("Watch", { userIds: users, unwatchUserIds: unwatch }).then((r) => {
      for (const u of users) this._memory.watching.add(u);
      for (const u of unwatch) this._memory.watching.delete(u);
      return r.statuses ?? [];
    });
  }

  // ---- internals -------------------------------------------------------------------------------

  _setState(state) {
    if (this._state === state) return;
    this._state = state;
    this.dispatchEvent(new CustomEvent("connectionstate", { detail: state }));
  }

  _call(method, request) {
    return new Promise((resolve, reject) => {
      const id = ++this._nextId;
      const timer = setTimeout(() => {
        this._calls.delete(id);
        this._waiting = this._waiting.filter((w) => w.id !== id);
        reject(new PresenceError("DEADLINE_EXCEEDED", `${method} got no answer within ${this.callTimeoutMs} ms`));
      }, this.callTimeoutMs);
      this._calls.set(id, { resolve, reject, timer });
      const message = { id, method, request };
      if (this._state === ConnectionState.connected && this._socket?.readyState === 1) this._socket.send(JSON.stringify(message));
      else if (this._state === ConnectionState.disconnected || this._state === ConnectionState.notInitialized) {
        this._settle(id, null, { code: "FAILED_PRECONDITION", message: "NOT_CONNECTED: call connect() first" });
      } else this._waiting.push(message);   // sent once the session is open again
    });
  }

  _settle(id, response, error) {
    const call = this._calls.get(id);
    if (!call) return;
    this._calls.delete(id);
    clearTimeout(call.timer);
    if (error) call.reject(new PresenceError(error.code, error.message));
    else call.resolve(response ?? {});
  }

  _failAll(error) {
    for (const [id, call] of this._calls) {
      clearTimeout(call.timer);
      call.reject(error);
      this._calls.delete(id);
    }
    this._waiting = [];
  }

  _open() {
    const url = this.servers[this._server];
    let socket;
    try {
      socket = new this._WS(url);
    } catch (e) {
      this._broken();
      return;
    }
    this._socket = socket;
    socket.onopen = () => {
      const open = { userId: this.userId };
      if (this.token) open.token = this.token;
      if (this._sessionId) open.resumeSessionId = this._sessionId;
      if (this._memory.status) open.initialStatus = this._memory.status;
      socket.send(JSON.stringify({ open }));
    };
    socket.onmessage = (m) => {
      let msg;
      try { msg = JSON.parse(m.data); } catch (_) { return; }
      if (msg.id !== undefined) { this._settle(msg.id, msg.response, msg.error); return; }
      if (msg.error) { this._lastError = msg.error; return; }
      const e = msg.event;
      if (!e) return;
      if (e.opened) this._opened(e.opened);
      else if (e.presence) this._presence(e.presence);
      else if (e.status) this.dispatchEvent(new CustomEvent("status", { detail: e.status }));
    };
    socket.onclose = (c) => {
      if (this._socket !== socket) return;
      this._socket = null;
      this._closed(c.code);
    };
  }

  _opened(o) {
    const resumedLost = this._sessionId && !o.resumed;
    this._sessionId = o.sessionId;
    this._backoff = 100;
    this._setState(ConnectionState.connected);
    const first = this._firstOpen;
    this._firstOpen = null;
    if (first) first.resolve(o);
    const waiting = this._waiting;
    this._waiting = [];
    if (resumedLost || this._restore) {
      this._restore = false;
      this._restoreMemory().finally(() => { for (const w of waiting) this._socket?.send(JSON.stringify(w)); });
    } else {
      for (const w of waiting) this._socket?.send(JSON.stringify(w));
    }
  }

  /** A new session after the old one was lost: the channels, state and watches come back. */
  async _restoreMemory() {
    const m = this._memory;
    try {
      for (const c of m.channels.values()) {
        await this._call("Join", { channelName: c.channel, channelType: c.type, withPresence: c.withPresence });
      }
      for (const [key, items] of m.state) {
        const [type, ...rest] = key.split("/");
        const list = Object.entries(items).map(([k, v]) => ({ key: k, value: String(v) }));
        if (list.length) await this._call("SetState", { channelName: rest.join("/"), channelType: type, items: list });
      }
      if (m.watching.size) await this._call("Watch", { userIds: [...m.watching] });
    } catch (_) { /* a failed restore shows in the roster; the app may retry */ }
  }

  _presence(p) {
    this.dispatchEvent(new CustomEvent("presence", { detail: p }));
    if (p.type !== "PRESENCE_EVENT_TYPE_SNAPSHOT") return;
    const key = `${p.channelType}/${p.channelName}`;
    const users = [...(this._pages.get(key) ?? []), ...(p.snapshot ?? [])];
    if (p.snapshotContinues) { this._pages.set(key, users); return; }
    this._pages.delete(key);
    this.dispatchEvent(new CustomEvent("snapshot", { detail: { channel: p.channelName, type: p.channelType, users, sequence: p.sequence } }));
  }

  _closed(code) {
    if (this._closing) return;
    const final = FINAL_CLOSES.has(code) || code === 1000;
    if (final) {
      const error = new PresenceError(this._lastError?.code ?? "UNAVAILABLE", this._lastError?.message ?? `the server closed the session (${code})`);
      this._sessionId = null;
      this._failAll(error);
      const first = this._firstOpen;
      this._firstOpen = null;
      if (first) first.reject(error);
      this._setState(ConnectionState.disconnected);
      return;
    }
    if (code === 4404) {
      // the session to resume is gone (its presence timed out): a new one, restored from memory
      this._sessionId = null;
      this._restore = true;
    }
    this._broken();
  }

  /** The stream broke: resume on the next server after a backoff. */
  _broken() {
    if (this._state === ConnectionState.connected) this._setState(ConnectionState.reconnecting);
    this._server = (this._server + 1) % this.servers.length;
    const delay = Math.min(this._backoff, this.maxBackoffMs) * (0.75 + Math.random() * 0.5);
    this._backoff = Math.min(this._backoff * 2, this.maxBackoffMs);
    clearTimeout(this._retryTimer);
    this._retryTimer = setTimeout(() => this._open(), delay);
  }
}
