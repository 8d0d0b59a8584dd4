-- v2 binary tensor extension: the body in $BENCH_BODY is a JSON header followed by raw tensor
-- bytes; $BENCH_HEADER_LEN is the JSON header's length in bytes and must be a positive integer.
local dir = debug.getinfo(1, "S").source:sub(2):match("(.*/)") or "./"
local common = dofile(dir .. "common.lua")

local hlen = os.getenv("BENCH_HEADER_LEN")
assert(hlen and hlen:match("^%d+$") and tonumber(hlen) > 0,
       "BENCH_HEADER_LEN must be a positive integer (never send an empty header)")

wrk.method = "POST"
wrk.body = common.read_body()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = hlen

done = common.done
