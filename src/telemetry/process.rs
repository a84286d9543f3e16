//! The standard process metrics, under the names every Prometheus client
//! library uses (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! ...), read from `/proc/self` at each scrape. Linux only.
//!
//! Read here rather than through the `prometheus` crate's `process` feature:
//! that pulls `procfs` and a second major version of `rustix`, needs `libc`
//! calls this crate's `forbid(unsafe_code)` rules out, and counts CPU time in
//! whole seconds. The page size and clock tick come from `/proc/self/auxv`.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Gauge, Opts};

/// What one scrape reads; a field is `None` when its file could not be read.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Sample {
    pub cpu_seconds: Option<f64>,
    pub virtual_memory_bytes: Option<f64>,
    pub resident_memory_bytes: Option<f64>,
    pub threads: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
}

/// The fields of `/proc/self/stat` used here (man 5 proc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    utime: u64,
    stime: u64,
    num_threads: u64,
    starttime: u64,
    vsize: u64,
    rss_pages: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses
/// and may itself contain spaces and parentheses: fields are counted from
/// the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // `rest` starts at field 3 (state): field n is at index n - 3.
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        num_threads: field(20)?,
        starttime: field(22)?,
        vsize: field(23)?,
        rss_pages: field(24)?,
    })
}

/// The soft "Max open files" limit of `/proc/<pid>/limits`; `None` when
/// unlimited or absent.
fn parse_max_open_files(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_ascii_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `btime` (boot time, Unix seconds) of `/proc/stat`.
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

const AT_PAGESZ: u64 = 6;
const AT_CLKTCK: u64 = 17;

/// (page size, clock ticks per second) from the auxiliary vector: pairs of
/// native-endian machine words, ending with a zero key.
fn parse_auxv(bytes: &[u8]) -> (Option<u64>, Option<u64>) {
    const WORD: usize = std::mem::size_of::<usize>();
    let word = |chunk: &[u8]| -> u64 {
        let mut buf = [0u8; WORD];
        buf.copy_from_slice(chunk);
        usize::from_ne_bytes(buf) as u64
    };
    let (mut page, mut tick) = (None, None);
    for pair in bytes.chunks_exact(2 * WORD) {
        let (key, value) = (word(&pair[..WORD]), word(&pair[WORD..]));
        match key {
            0 => break,
            AT_PAGESZ => page = Some(value),
            AT_CLKTCK => tick = Some(value),
            _ => {}
        }
    }
    (page, tick)
}

/// Reads this process's numbers now.
pub(crate) fn sample(page_size: u64, ticks_per_second: u64, boot_time: Option<u64>) -> Sample {
    let mut sample = Sample::default();
    let ticks = ticks_per_second.max(1) as f64;
    if let Some(stat) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .as_deref()
        .and_then(parse_stat)
    {
        sample.cpu_seconds = Some((stat.utime + stat.stime) as f64 / ticks);
        sample.virtual_memory_bytes = Some(stat.vsize as f64);
        sample.resident_memory_bytes = Some((stat.rss_pages * page_size) as f64);
        sample.threads = Some(stat.num_threads as f64);
        sample.start_time_seconds =
            boot_time.map(|boot| boot as f64 + stat.starttime as f64 / ticks);
    }
    // Counts the descriptor that reads the directory too, as other clients do.
    sample.open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|dir| dir.count() as f64);
    sample.max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .as_deref()
        .and_then(parse_max_open_files)
        .map(|n| n as f64);
    sample
}

/// A [`Collector`] that samples `/proc/self` at each scrape. A value that
/// cannot be read is left out of that scrape rather than shown as 0.
pub struct ProcessCollector {
    page_size: u64,
    ticks_per_second: u64,
    boot_time: Option<u64>,
    descs: Vec<Desc>,
    cpu: Counter,
    virtual_memory: Gauge,
    resident_memory: Gauge,
    threads: Gauge,
    start_time: Gauge,
    open_fds: Gauge,
    max_fds: Gauge,
}

impl ProcessCollector {
    pub fn new() -> ProcessCollector {
        let (page_size, ticks) = std::fs::read("/proc/self/auxv")
            .map(|bytes| parse_auxv(&bytes))
            .unwrap_or_default();
        let gauge =
            |name: &str, help: &str| Gauge::with_opts(Opts::new(name, help)).expect("valid metric");
        let cpu = Counter::with_opts(Opts::new(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
        ))
        .expect("valid metric");
        let collector = ProcessCollector {
            page_size: page_size.unwrap_or(4096),
            // USER_HZ, what the kernel reports times in, is 100 where it is not told.
            ticks_per_second: ticks.unwrap_or(100),
            boot_time: std::fs::read_to_string("/proc/stat")
                .ok()
                .as_deref()
                .and_then(parse_boot_time),
            descs: Vec::new(),
            cpu,
            virtual_memory: gauge(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
            ),
            resident_memory: gauge(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
            ),
            threads: gauge("process_threads", "Number of OS threads in the process."),
            start_time: gauge(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
            ),
            open_fds: gauge("process_open_fds", "Number of open file descriptors."),
            max_fds: gauge(
                "process_max_fds",
                "Maximum number of open file descriptors.",
            ),
        };
        let descs = collector
            .all()
            .iter()
            .flat_map(|c| c.desc())
            .cloned()
            .collect();
        ProcessCollector { descs, ..collector }
    }

    fn all(&self) -> [&dyn Collector; 7] {
        [
            &self.cpu,
            &self.virtual_memory,
            &self.resident_memory,
            &self.threads,
            &self.start_time,
            &self.open_fds,
            &self.max_fds,
        ]
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let now = sample(self.page_size, self.ticks_per_second, self.boot_time);
        let mut families = Vec::with_capacity(7);
        if let Some(cpu) = now.cpu_seconds {
            // A counter only rises: add what was spent since the last scrape.
            let delta = cpu - self.cpu.get();
            if delta > 0.0 {
                self.cpu.inc_by(delta);
            }
            families.extend(self.cpu.collect());
        }
        for (value, gauge) in [
            (now.virtual_memory_bytes, &self.virtual_memory),
            (now.resident_memory_bytes, &self.resident_memory),
            (now.threads, &self.threads),
            (now.start_time_seconds, &self.start_time),
            (now.open_fds, &self.open_fds),
            (now.max_fds, &self.max_fds),
        ] {
            if let Some(value) = value {
                gauge.set(value);
                families.extend(gauge.collect());
            }
        }
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        // A command name with spaces and a ")" must not shift the fields.
        let text = "4242 (key gate) (x)) S 1 4242 4242 0 -1 4194560 2500 0 0 0 \
                    150 70 0 0 20 0 9 0 123456 987654321 2048 18446744073709551615 \
                    1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                utime: 150,
                stime: 70,
                num_threads: 9,
                starttime: 123456,
                vsize: 987654321,
                rss_pages: 2048,
            })
        );
        assert_eq!(parse_stat("4242 (truncated) S 1"), None);
    }

    #[test]
    fn limits_boot_time_and_auxv_are_parsed() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63704                63704                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_max_open_files(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files     \n";
        assert_eq!(parse_max_open_files(unlimited), None);
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"),
            Some(1_700_000_000)
        );
        let words: Vec<u8> = [
            33usize,
            7,
            AT_PAGESZ as usize,
            16384,
            AT_CLKTCK as usize,
            250,
            0,
            0,
            6,
            1,
        ]
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .collect();
        assert_eq!(parse_auxv(&words), (Some(16384), Some(250)));
    }

    #[test]
    fn this_process_samples_plausibly() {
        let (page, tick) = parse_auxv(&std::fs::read("/proc/self/auxv").unwrap());
        assert!(page.is_some_and(|p| p >= 4096), "{page:?}");
        assert!(tick.is_some_and(|t| t > 0), "{tick:?}");
        let collector = ProcessCollector::new();
        let now = sample(
            collector.page_size,
            collector.ticks_per_second,
            collector.boot_time,
        );
        assert!(now.resident_memory_bytes.unwrap() > 0.0);
        assert!(now.virtual_memory_bytes.unwrap() >= now.resident_memory_bytes.unwrap());
        assert!(now.threads.unwrap() >= 1.0);
        let open = now.open_fds.unwrap();
        assert!(open >= 3.0 && now.max_fds.is_none_or(|max| open <= max));
        let start = now.start_time_seconds.unwrap();
        let unix_now = crate::clock::now_secs() as f64;
        assert!(
            start <= unix_now + 1.0 && start > unix_now - 86_400.0 * 365.0,
            "{start}"
        );
        let names: Vec<String> = collector
            .collect()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        assert_eq!(names.len(), 7, "{names:?}");
        assert_eq!(collector.desc().len(), 7);
    }
}
