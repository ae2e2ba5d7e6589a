#!lua
--[[
  READY -> RESERVED for up to `count` jobs, in priority then due order. First moves what is
  due (DELAYED -> READY) and expires passed reservations, so a consumer never waits on the
  pump. A paused queue (CONF `paused`) hands out nothing; the rest is done all the same.
  Each reserved job has its tries decremented, its ttr deadline set and a lease: the
  token of this delivery, which ack, touch, release and republish may present.
  Bounded: at most `limit` jobs are dropped (expired), held back or delayed (their group's
  pause, concurrency or rate limit: lib/groups.lua) from the head of READY per call (the rest
  is left for the next call, or the pump's expire_ttl), so no call runs long whatever the data.
  A grouped job's place in READY is its group's fair tag, not its due time (lib/groups.lua).
  KEYS[1..16] queue: the queue's fixed keys, in the order of lib/keys.lua
  ARGV[1] now: the caller's clock (ms)
  ARGV[2] ttr: the reservation's time to run (ms)
  ARGV[3] count: jobs wanted
  ARGV[4] limit: jobs promoted, expired or skipped per call
  ARGV[5] notify: the queue's notify channel
  ARGV[6] open_lead: how long before its window a wheel bucket opens (ms)
  ARGV[7] lease_prefix: 6 random bytes; the i-th job reserved by this call gets prefix .. u16(i)
  ARGV[8] seed: a random number in [0, 1): the jitter of retry backoffs (lib/retry.lua retry)
  ARGV[9] report: '1' when the caller will wait on the queue if it gets fewer than `count`
    (a long-poll): the reply then says what the queue holds next (ready, next below)
  Returns: {lowered, stale, retried, dead, expired, more, ready, next, member_1, record_1,
    lease_1, ...}
    (records as delivered;
    lowered: when the queue's next pump event moved earlier (see publish.lua), the earliest
    event this call added (ms: a ttr end, a retry backoff's end), else 0;
    stale: when a wheel bucket should already be open, i.e. the pump is behind, this call's
    `now` (else 0): the caller then opens it itself, as of that time, and consumes again;
    retried, dead, expired: jobs this call moved on the way: ttr passed -> READY again, ttr
    passed with no tries left -> DEAD, ttl ended -> gone; for the metrics;
    more: 1 when the call stopped at its bound of skipped jobs before `count` were reserved;
    ready, next: with `report`, when fewer than `count` were reserved (the caller's long-polls
    will wait), the jobs left in READY and the queue's next event (ms, -1: none), so that they
    need not ask with sizes.lua; else -1, -1)
]]
--@include lib/codes
--@include lib/keys
--@include lib/record
--@include lib/jobs
--@include lib/groups
--@include lib/promote
--@include lib/retry
--@include lib/sizes
--@include lib/notify
local now, ttr, count, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local prefix = ARGV[7]
local was_empty = redis.call('EXISTS', READY) == 0
local retried, dead, gone, backoff = expire_reservations(now, limit, tonumber(ARGV[8]))
local _, gone2 = promote(now, limit)
local out = {0, 0, 0, 0, 0, 0, -1, -1}
local asked = count
local got, skipped, dropped = 0, 0, 0 -- skipped: expired, held back or delayed by a group
if redis.call('HGET', CONF, 'paused') == '1' then count = 0 end
-- READY -> RESERVED: one try spent, one delivery counted, its lease made
local function reserve(id, rec)
  local _, _, tries, deliveries = header(rec)
  rec = with_counts(rec, tries - 1, deliveries + 1)
  got = got + 1
  local lease = prefix .. struct.pack('>H', got)
  redis.call('HSET', JOBS, id, rec)
  redis.call('ZADD', RESERVED, now + ttr, id)
  redis.call('HSET', LEASES, id, lease)
  out[#out + 1] = id
  out[#out + 1] = rec
  out[#out + 1] = lease
end
while got < count and skipped < limit do
  local popped = redis.call('ZPOPMIN', READY, math.min(count - got, limit - skipped))
  if #popped == 0 then break end
  for i = 1, #popped, 2 do
    local id = popped[i]
    local rec = redis.call('HGET', JOBS, id)
    local g = rec and group_of(rec)
    if rec and expired(rec, now) then
      discard(id, rec)
      skipped, dropped = skipped + 1, dropped + 1
      if g then let_one_go(g, now) end
    elseif rec then
      -- a grouped job: held back while its group is paused, at its concurrency limit or
      -- past its rate (then its group's wake-up is at its next turn: lib/promote.lua)
      local conf, turn = g and group_conf(g), 0
      local taken = not g or take_slot(g, conf)
      if g and taken and conf[3] then
        turn = rate_turn(g, conf, now)
        if turn > 0 then give_back(g, taken) end
      end
      if g and (turn > 0 or not taken) then
        hold(g, id)
        skipped = skipped + 1
        if turn > 0 then
          redis.call('ZADD', GWAKE, 'LT', turn, g)
          if lower_next(turn) == 1 then backoff = earliest(backoff, turn) end
        end
      else
        reserve(id, rec)
      end
    end
  end
end
flush_rates() -- the turns its deliveries took, and its groups' reserved counts, once per group
flush_slots()
local lowered = backoff
if got > 0 and lower_next(now + ttr) == 1 then lowered = earliest(lowered, now + ttr) end
out[1], out[3], out[4], out[5] = lowered, retried, dead, gone + gone2 + dropped
if got < count and skipped >= limit then out[6] = 1 end
local w = first_score(WHEEL)
if w and w - tonumber(ARGV[6]) <= now then out[2] = now end
-- META.next passed and nothing left ready: the event it marked was this call's (or another
-- consumer's) to take. Brought up to the queue's next event, so that multi-queue consumes
-- (which visit a queue whose META.next has passed) stop visiting it until then, instead of
-- until the pump's next step. Exact, so still no later than any event of the queue.
local sizes = ARGV[9] == '1' and got < asked and queue_sizes(tonumber(ARGV[6])) or nil
if sizes then out[7], out[8] = redis.call('ZCARD', READY), sizes[5] end
local marked = next_marked()
if marked and marked <= now and out[2] == 0 and redis.call('EXISTS', READY) == 0 then
  local nxt = (sizes or queue_sizes(tonumber(ARGV[6])))[5]
  set_next(nxt)
end
tidy()
notify(ARGV[5], was_empty)
return out
