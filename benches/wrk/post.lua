-- A 1 KiB POST body on every request (the `-post` cases): what reading a
-- small body whole before forwarding it costs each proxy (nginx buffers
-- request bodies by default, keygate up to limits.buffered_body_bytes).
dofile(os.getenv("BENCH_WRK_DIR") .. "/report.lua")

wrk.method = "POST"
wrk.body = string.rep("x", 1024)
wrk.headers["Content-Type"] = "application/octet-stream"
