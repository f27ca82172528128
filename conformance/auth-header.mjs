// Preload (node --import): adds "Authorization: $CONFORMANCE_AUTH" to every HTTP request the
// conformance runner makes (fetch and undici.request) that has no Authorization header of its own.
import { Agent, setGlobalDispatcher } from "undici";
const value = process.env.CONFORMANCE_AUTH;
if (value) {
  const addAuth = (dispatch) => (opts, handler) => {
    let h = opts.headers;
    if (h == null) h = {};
    if (Array.isArray(h)) {
      const has = h.some((x, i) => i % 2 === 0 && String(x).toLowerCase() === "authorization");
      if (!has) h = [...h, "authorization", value];
    } else if (typeof h[Symbol.iterator] === "function" && typeof h !== "string") {
      const arr = [...h].flat();
      const has = arr.some((x, i) => i % 2 === 0 && String(x).toLowerCase() === "authorization");
      h = has ? arr : [...arr, "authorization", value];
    } else {
      const has = Object.keys(h).some((k) => k.toLowerCase() === "authorization");
      if (!has) h = { ...h, authorization: value };
    }
    return dispatch({ ...opts, headers: h }, handler);
  };
  setGlobalDispatcher(new Agent().compose(addAuth));
}

// The SEP-2243 header scenarios use node:http directly.
import http from "node:http";
import { syncBuiltinESMExports } from "node:module";
if (value) {
  const original = http.request;
  http.request = function (options, ...rest) {
    if (options && typeof options === "object" && !(options instanceof URL)) {
      const headers = { ...(options.headers || {}) };
      if (!Object.keys(headers).some((k) => k.toLowerCase() === "authorization")) headers.authorization = value;
      options = { ...options, headers };
    }
    return original.call(this, options, ...rest);
  };
  syncBuiltinESMExports();
}
