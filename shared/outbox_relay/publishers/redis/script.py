"""The idempotent publish script (check the dedupe key, XADD, store the entry id under it, atomically)
and how a batch is cut into its calls."""

from __future__ import annotations

from ...models import ClaimedMessage, DeliveryResult, ErrorClass

# KEYS: the stream, then each message's dedupe key. ARGV: the bound (0: none), the dedupe
# TTL (ms), trimming ('maxlen', or acknowledged 'hold'/'trim'), '1' when the caller WAITs
# (a dedupe hit then writes too, so the WAIT covers its entry), then per message its key
# ('' = none) and the entry's fields, joined by NUL (one argument each: redis-py packs
# arguments in Python; PostgreSQL text holds no NUL).
# Reply, one string (redis-py parses arrays in Python): a line per message, "<entry id>",
# "=<entry id>" (a duplicate), "!<error>", "~" (its key failed earlier) or "#" (stream at
# its bound); then "^<count>" when 'trim' removed unacknowledged entries.
PUBLISH_SCRIPT = """
local stream = KEYS[1]
local bound = tonumber(ARGV[1])
local ttl = ARGV[2]
local trimming = ARGV[3]
local waits = ARGV[4] == '1'
local find, sub, pcall = string.find, string.sub, redis.pcall
local n = #KEYS - 1
local xadd_trim = trimming == 'maxlen' and bound > 0
local room = n
local dropped = 0
local function below(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, bm = tonumber(am), tonumber(bm)
  if am ~= bm then return am < bm end
  return tonumber(as) < tonumber(bs)
end
-- The end of the range every consumer group has acknowledged, as XRANGE takes it: up to
-- and including its last-delivered id, or below its oldest pending entry when it has
-- pending entries; the lowest over the groups; nil when the stream has no group.
local function acknowledged_end()
  local groups = pcall('XINFO', 'GROUPS', stream)
  if type(groups) ~= 'table' or groups.err then return nil end
  local best, best_excl = nil, false
  for _, g in ipairs(groups) do
    local f = {}
    for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
    local id, excl = f['last-delivered-id'], false
    if tonumber(f['pending']) > 0 then id, excl = redis.call('XPENDING', stream, f['name'])[2], true end
    if best == nil or below(id, best) or (id == best and excl) then best, best_excl = id, excl end
  end
  if best == nil then return nil end
  return best_excl and ('(' .. best) or best
end
local function acknowledged_count(upto, count)
  return #redis.call('XRANGE', stream, '-', upto, 'COUNT', count)
end
local keep = nil
local trim_after = false
-- pcall: a key that is not a stream fails its XADDs below, each as the message's fault;
-- an XLEN raised here would fail the whole call, and Redis 6 words that error as ERR.
local len = (trimming ~= 'maxlen' and bound > 0) and pcall('XLEN', stream) or 0
if type(len) == 'table' then bound = 0 end
if trimming ~= 'maxlen' and bound > 0 then
  local over = len + n - bound
  if over > 0 then
    keep = acknowledged_end()
    if keep == nil then
      trim_after = true  -- no consumer group: nothing to protect, trimmed as MAXLEN would
    else
      local removable = acknowledged_count(keep, over)
      if removable > 0 then redis.call('XTRIM', stream, 'MAXLEN', len - removable) end
      if trimming == 'hold' then room = bound - (len - removable) else trim_after = true end
    end
  end
end
local out = {}
local failed = {}
local added = 0
for i = 1, n do
  local f = ARGV[i + 4]
  local a = find(f, '\\0', 1, true)
  local key = a > 1 and sub(f, 1, a - 1) or nil
  local dedupe = KEYS[i + 1]
  local prior = key and failed[key] and '~' or pcall('GET', dedupe)
  if prior == '~' then
    out[i] = '~'
  elseif type(prior) == 'string' then
    if waits then redis.call('PEXPIRE', dedupe, ttl) end
    out[i] = '=' .. prior
  elseif added >= room then
    out[i] = '#'
  else
    local t, j, p = {}, 0, a + 1
    while true do
      local q = find(f, '\\0', p, true)
      j = j + 1
      if q == nil then t[j] = sub(f, p); break end
      t[j] = sub(f, p, q - 1)
      p = q + 1
    end
    local res
    if xadd_trim then
      res = pcall('XADD', stream, 'MAXLEN', '~', ARGV[1], '*', unpack(t))
    else
      res = pcall('XADD', stream, '*', unpack(t))
    end
    if type(res) == 'table' and res.err then
      out[i] = '!' .. string.gsub(res.err, '[\\r\\n]', ' ')
      if key then failed[key] = true end
    else
      redis.call('SET', dedupe, res, 'PX', ttl)
      out[i] = res
      added = added + 1
    end
  end
end
if trim_after then
  local over = redis.call('XLEN', stream) - bound
  if over > 0 then
    if keep ~= nil then
      dropped = over - acknowledged_count(keep, over)
    end
    redis.call('XTRIM', stream, 'MAXLEN', bound)
  end
end
if dropped > 0 then out[n + 1] = '^' .. dropped end
return table.concat(out, '\\n')
"""

#: Messages per script call: bounds how long one call blocks Redis (a key's messages stay together).
SCRIPT_CHUNK = 250
KEY_STOPPED = "redis: not attempted: an earlier message of its key failed in this batch"


def dedupe_prefix(stream: str) -> str:
    """`{stream}:outbox-dedupe:` (in the stream's hash slot), or without braces when it has a hash tag."""
    start = stream.find("{")
    if start != -1 and stream.find("}", start + 2) != -1:
        return f"{stream}:outbox-dedupe:"
    return f"{{{stream}}}:outbox-dedupe:"


def all_failed(batch: list[ClaimedMessage], error_class: ErrorClass, error: str) -> list[DeliveryResult]:
    """A whole call failed: each key's first message with the error, its later ones not attempted."""
    seen: set[str] = set()
    out = []
    for m in batch:
        if m.key is not None and m.key in seen:
            out.append(DeliveryResult(m.seq, error_class=ErrorClass.NOT_ATTEMPTED, error=KEY_STOPPED))
            continue
        if m.key is not None:
            seen.add(m.key)
        out.append(DeliveryResult(m.seq, error_class=error_class, error=error))
    return out


def script_calls(group: list[ClaimedMessage]) -> list[list[ClaimedMessage]]:
    """Calls of about `SCRIPT_CHUNK`, a key's in one (the script stops a key at its first failure)."""
    if len(group) <= SCRIPT_CHUNK:
        return [group]
    chunks: list[list[ClaimedMessage]] = [[]]
    chunk_of: dict[str, list[ClaimedMessage]] = {}
    for m in group:
        chunk = chunk_of.get(m.key) if m.key is not None else None
        if chunk is None:
            chunk = chunks[-1]
            if len(chunk) >= SCRIPT_CHUNK:
                chunk = []
                chunks.append(chunk)
            if m.key is not None:
                chunk_of[m.key] = chunk
        chunk.append(m)
    return chunks
