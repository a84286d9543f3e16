-- Prints one JSON line with wrk's totals, for benches/run to collect.
-- Loaded by every case, alone or through dofile() from another script.
-- Errors: wrk counts socket errors and responses with a status above 399;
-- keygate and nginx send no 1xx or 3xx to these requests.
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nRESULT {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
