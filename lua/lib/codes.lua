--[[
  Reply codes: one meaning each, in every script. A script that says `--@include lib/codes`
  (before the other libs, which use them too) writes CODE.NAME; the loader
  (cluster_dq/engine/scripts.py) folds each into its number, so no script builds this table
  at run time, and an unknown name fails at load time. cluster_dq/engine/replies.py mirrors
  the table (ReplyCode); tests/engine/test_lua_contract.py checks that both agree.
  Counts, times and 0/1 flags (lowered, stale, more, allowed) are plain numbers, not codes.
]]
local CODE = {
  -- where a job is (or went): ack, release, republish, peek_job, publish
  NOT_FOUND = 0,          -- no job in a state the script acts on; nothing done to it
  DELAYED = 1,            -- DELAYED, in the near-term zset
  READY = 2,
  RESERVED = 3,
  DEAD = 4,
  WHEEL = 5,              -- DELAYED, resting in a wheel bucket (publish)
  -- outcomes
  DUPLICATE = 6,          -- publish: the id is present, or was acked lately; nothing written
  EXPIRED = 7,            -- its ttl ended: removed (release)
  OK = 8,                 -- the check passed (a lease holds its job; a shard step's epoch is current)
  FULL = 9,               -- publish: the queue holds its max_size jobs; nothing written
  EXISTING = 10,          -- publish_keyed: the dedup key's holder answered; nothing written
  REPLACED = 11,          -- publish_keyed: the dedup key's waiting holder replaced (debounce)
  -- why a lease does not hold its job (lease_check in lib/lease.lua); nothing changed
  LEASE_DELAYED = -1,     -- the job is delayed
  LEASE_READY = -2,       -- the job is ready
  LEASE_TAKEN = -3,       -- the job is reserved by another (later) delivery
  LEASE_DEAD = -4,        -- the job is dead
  LEASE_TTR_EXPIRED = -5, -- still this delivery's, but its ttr ran out (not yet moved by the pump)
  LEASE_GONE = -6,        -- the job is gone (acked, expired, destroyed)
  -- a shard step (claim, reschedule) carrying an older leadership epoch; nothing changed
  FENCED = -7,
  -- a per-job operation (bury, kick, reschedule) that the job's state forbids; nothing changed
  FORBIDDEN = -8,
  -- reschedule: the new due time is at or past the job's ttl end; nothing changed
  TOO_LATE = -9,
  -- publish_keyed: the Idempotency-Key came with another request; nothing written
  MISMATCH = -10,
}
