--[[
  The queue's fixed KEYS, and the bounds of variadic calls. Like every lib, inlined by
  cluster_dq/engine/scripts.py where a script (or a lib it includes) says `--@include lib/keys`,
  once per script, after `--@include lib/codes`, whose CODE table the libs use. Never loaded
  on its own.
  Every queue script receives the same sixteen fixed KEYS, in this order (the order of
  QueueKeys.all_fixed in cluster_dq/keys.py; tests/engine/test_lua_contract.py checks both agree),
  then its own extras (from KEYS[FIRST_EXTRA]).
]]
local META, WHEEL, DELAYED, READY, RESERVED, DEAD, JOBS, EXPIRE, ACKED, LEASES, CONF, NOTES,
  GROUPS, HELD, GCONF, GWAKE =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10],
  KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16]

local FIRST_EXTRA = 17
local CHUNK = 500                -- variadic calls are batched (Lua's unpack has a limit)

local function zrem_many(key, ids)
  for i = 1, #ids, CHUNK do
    redis.call('ZREM', key, unpack(ids, i, math.min(i + CHUNK - 1, #ids)))
  end
end

-- A variadic write of pairs, `cmd key a1 b1 a2 b2 ...` (ZADD's score and member, HSET's field
-- and value), CHUNK pairs per call.
local function write_pairs(cmd, key, args)
  for i = 1, #args, 2 * CHUNK do
    redis.call(cmd, key, unpack(args, i, math.min(i + 2 * CHUNK - 1, #args)))
  end
end
