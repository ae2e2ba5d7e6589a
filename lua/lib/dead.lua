--[[
  The dead letter: a cursor into DEAD that survives concurrent writes, a bounded sweep of
  it (redrive, purge), and a job brought back alive.
]]
--@include lib/keys
--@include lib/record
--@include lib/jobs
--@include lib/notes

-- Whether member `a` sorts at or before `b` in a sorted set at equal scores (memcmp order; Lua's
-- own `<` on strings follows the locale).
local function bytes_le(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a <= #b
end

-- The rank in DEAD of the first entry after position (score, member) in DEAD's order, whether
-- that entry still exists or not: a cursor that survives concurrent writes. O(log^2 n).
-- member '' means "before every member at this score".
local function dead_rank_after(score, member)
  local lo = redis.call('ZCOUNT', DEAD, '-inf', '(' .. score)
  if member == '' then return lo end
  local hi = redis.call('ZCOUNT', DEAD, '-inf', score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if bytes_le(redis.call('ZRANGE', DEAD, mid, mid)[1], member) then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- DEAD -> READY (due <= now) or DELAYED (due later), with `tries` and a fresh ttl (ms, 0 =
-- never): kick and redrive. Forgets its death, keeps its last error; a debounce's job carries
-- its new due time. Returns its state code, the `lowered` flag and the new record.
local function revive(id, rec, now, due, tries, ttl)
  redis.call('ZREM', DEAD, id)
  local exp = 0
  if ttl > 0 then exp = now + ttl end
  rec = with_due(with_tries_expire(rec, tries, exp), math.max(due, now), id)
  redis.call('HSET', JOBS, id, rec)
  local st, lowered = CODE.READY, 0
  if due > now then
    delay_until(id, due)
    lowered = lower_next(due)
    st = CODE.DELAYED
  else
    make_ready(id, rec, now)
  end
  if exp > 0 then
    redis.call('ZADD', EXPIRE, exp, id)
    lowered = math.max(lowered, lower_next(exp))
  end
  forget_death(id)
  return st, lowered, rec
end

-- Bytes of records one call of dead_page or redrive_dead reads at most (past its first job):
-- bodies of up to 1 MB must not make a call of 1,000 jobs copy a gigabyte.
local RECORD_BYTES_PER_CALL = 8388608

-- The dead entries one sweep (redrive, purge) examines, flat {member, score, ...}: from just
-- after the cursor (score, member), or from the time of death `from` when there is none (score
-- -1), at most `examine` of them.
local function dead_window(score, member, from, examine)
  local r
  if score >= 0 then
    r = dead_rank_after(score, member)
  else
    r = redis.call('ZCOUNT', DEAD, '-inf', '(' .. from)
  end
  return redis.call('ZRANGE', DEAD, r, r + examine - 1, 'WITHSCORES')
end

-- Walks a dead window up to the time of death `to`, calling act(id) on each entry whose reason
-- is `reason` (-1: any) until `limit` were acted on. Returns the number acted on, `more` (1:
-- entries may follow the last one examined) and the last one examined (score -1: none).
-- `full()`, when given, says the call has done enough (bytes of records rewritten): it stops
-- there, as at `limit`.
local function sweep_dead(got, to, reason, limit, examine, act, full)
  local done, more, last_s, last_m = 0, 0, -1, ''
  local ended = false
  for i = 1, #got, 2 do
    local id, t = got[i], tonumber(got[i + 1])
    if t > to then
      ended = true
      break
    end
    if done >= limit or (full and full()) then
      more, ended = 1, true
      break
    end
    last_s, last_m = t, id
    if reason < 0 or note_of(id) == reason then
      act(id)
      done = done + 1
    end
  end
  if not ended and #got >= 2 * examine then more = 1 end
  return done, more, last_s, last_m
end
