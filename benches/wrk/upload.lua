-- A 1 MiB POST body on every request (the `-upload` cases): nginx buffers
-- the whole body (to a temporary file, past client_body_buffer_size) before
-- forwarding it, keygate streams a body above limits.buffered_body_bytes,
-- HAProxy streams. The upstream reads the body and drops it.
dofile(os.getenv("BENCH_WRK_DIR") .. "/report.lua")

wrk.method = "POST"
wrk.body = string.rep("x", 1048576)
wrk.headers["Content-Type"] = "application/octet-stream"
