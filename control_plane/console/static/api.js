// The control plane's JSON mapping of amc.v1.Scheduler (/api/amc.v1.Scheduler/<Method>),
// of the Admin methods the Host and Queue pages use (/api/amc.v1.Admin/<Method>) and of the
// Library methods the Apps page uses (/api/amc.v1.Library/<Method>): the same roles,
// validation and messages as the gRPC API. The token is kept for the tab's
// session and sent as a bearer header.

export const API = "/api/amc.v1.Scheduler/";
export const ADMIN_API = "/api/amc.v1.Admin/";
export const LIBRARY_API = "/api/amc.v1.Library/";
export const ARTIFACT_API = "/api/artifacts/";
export const TOKEN_KEY = "amc.token";

// The task statuses in order, which of them end a task and which run one: the control
// plane's own lists, given with the page (index.html's `statuses` block, filled by http.py).
const known = JSON.parse(document.getElementById("statuses").textContent);
export const STATUSES = known.statuses;
export const TERMINAL = new Set(known.terminal);
export const IN_FLIGHT = new Set(known.in_flight);

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

export async function call(method, body, api = API) {
  let response;
  try {
    response = await fetch(api + method, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(body || {}),
    });
  } catch (err) {
    throw new ApiError(0, "UNAVAILABLE", `the control plane did not answer (${err.message})`);
  }
  let data;
  try {
    data = await response.json();
  } catch {
    data = { code: "INTERNAL", message: `unexpected answer (HTTP ${response.status})` };
  }
  if (!response.ok) throw new ApiError(response.status, data.code, data.message);
  return data;
}
