-- API keys in rotation: thread t of BENCH_THREADS walks its own slice of the
-- BENCH_KEYS keys in order, so every key is used at the same rate. A key value
-- is "tb_" .. BENCH_KEY_PAD .. the key's index on 10 digits, as imported by
-- `harness.py keys` (89 characters, as long as a generated key).
dofile(os.getenv("BENCH_WRK_DIR") .. "/report.lua")

local keys = tonumber(os.getenv("BENCH_KEYS"))
local threads = tonumber(os.getenv("BENCH_THREADS"))
local pad = os.getenv("BENCH_KEY_PAD")
local path = os.getenv("BENCH_PATH") or "/api/bench"

local created = 0
function setup(thread)
  thread:set("id", created)
  created = created + 1
end

function init(args)
  if keys < threads then
    first = id % keys
    last = first
  else
    local per = math.ceil(keys / threads)
    first = id * per
    last = math.min(keys, first + per) - 1
  end
  nxt = first
  answered = 0
  failed = 0
end

function request()
  local i = nxt
  nxt = nxt + 1
  if nxt > last then nxt = first end
  return wrk.format("GET", path, {["X-Authorization"] = string.format("ApiKey tb_%s%010d", pad, i)})
end
