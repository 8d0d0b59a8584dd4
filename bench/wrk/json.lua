-- v2 JSON inference: POST the body in $BENCH_BODY as application/json. No
-- Inference-Header-Content-Length header at all (an empty one makes Triton answer 400).
local dir = debug.getinfo(1, "S").source:sub(2):match("(.*/)") or "./"
local common = dofile(dir .. "common.lua")

wrk.method = "POST"
wrk.body = common.read_body()
wrk.headers["Content-Type"] = "application/json"

done = common.done
