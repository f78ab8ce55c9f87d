//! Unit tests of the server configuration: flags and TOML to `ServeConfig`.

use super::*;

const TWO: &str = r#"
[server]
socket = "d/iocache.sock"
listen = "127.0.0.1:0"
admin_socket = "d/admin.sock"

[[volume]]
export = "fast"
backend = "d/fast.img"
backend_size = "64MiB"
cache = "d/cache-fast.img"
cache_size = "2MiB"

[[volume]]
export = "slow"
backend = "nbd+unix:///?socket=/tmp/x.sock"
cache = "d/cache-slow.img"
cache_size = "1MiB"
line_size = "64KiB"
write_policy = "wt"
promotion = "nhit:2"
policy = "s3fifo:small=0.1"
lookup = "coarse"
flush = "lazy"
direct = true
"#;

fn err(text: &str) -> String {
    format!("{:#}", from_toml_str(text, "conf.toml").unwrap_err())
}

/// The cache of volume `i`.
fn cache_of(c: &ServeConfig, i: usize) -> &CacheDeviceConfig {
    &c.caches[c.volumes[i].cache]
}

#[test]
fn two_volumes_parse() {
    let c = from_toml_str(TWO, "conf.toml").unwrap();
    assert_eq!(c.volumes.len(), 2);
    assert_eq!(c.listen, Some("127.0.0.1:0".parse().unwrap()));
    let (fast, slow) = (&c.volumes[0], &c.volumes[1]);
    assert_eq!(fast.export, "fast");
    assert_eq!(fast.backend_create_bytes, Some(64 << 20));
    assert!(slow.backend_is_nbd());
    let (fast, slow) = (cache_of(&c, 0), cache_of(&c, 1));
    assert_eq!(fast.line_size.bytes(), 4096);
    assert_eq!(fast.write_policy, WritePolicy::WriteBack);
    assert_eq!(slow.cache_bytes, Some(1 << 20));
    assert_eq!(slow.line_size.bytes(), 64 << 10);
    assert_eq!(slow.write_policy.to_string(), "wt");
    assert_eq!(slow.lookup, Lookup::Coarse);
    assert!(slow.direct);
}

#[test]
fn the_shipped_example_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/iocache.toml");
    let c = from_file(Path::new(path)).unwrap();
    assert!(c.volumes.len() >= 2, "{c:?}");
    assert!(c.socket.is_some() && c.listen.is_some() && c.admin_socket.is_some());
}

#[test]
fn limits_per_peer_are_read_and_checked() {
    let with = |keys: &str| TWO.replace("admin_socket =", &format!("{keys}\nadmin_socket ="));
    let c = from_toml_str(
        &with("max_connections_per_peer = 8\nmax_handshakes_per_peer = 2"),
        "conf.toml",
    )
    .unwrap();
    assert_eq!(
        (c.max_connections_per_peer, c.max_handshakes_per_peer),
        (Some(8), Some(2))
    );
    let c = from_toml_str(TWO, "conf.toml").unwrap();
    assert_eq!(
        (c.max_connections_per_peer, c.max_handshakes_per_peer),
        (None, None)
    );
    let e = err(&with("max_connections_per_peer = 0"));
    assert!(
        e.contains("server.max_connections_per_peer: 0 is not between 1 and 64"),
        "{e}"
    );
    let e = err(&with("max_handshakes_per_peer = 17"));
    assert!(
        e.contains("server.max_handshakes_per_peer: 17 is not between 1 and 16"),
        "{e}"
    );
}

#[test]
fn unknown_keys_are_named_with_the_file() {
    let e = err(&TWO.replace("direct = true", "directt = true"));
    assert!(e.contains("conf.toml") && e.contains("directt"), "{e}");
    let e = err(&TWO.replace("admin_socket", "admin_sock"));
    assert!(e.contains("conf.toml") && e.contains("admin_sock"), "{e}");
    let e = err(&format!("{TWO}\n[extra]\nx = 1\n"));
    assert!(e.contains("extra"), "{e}");
}

#[test]
fn impossible_values_name_the_volume_and_key() {
    for (from, to, needles) in [
        (
            "write_policy = \"wt\"",
            "write_policy = \"wz\"",
            &["volume `slow`", "write_policy", "wz"][..],
        ),
        (
            "line_size = \"64KiB\"",
            "line_size = \"3000B\"",
            &["volume `slow`", "line_size", "power of two"],
        ),
        (
            "lookup = \"coarse\"",
            "lookup = \"medium\"",
            &["volume `slow`", "lookup", "medium"],
        ),
        (
            "policy = \"s3fifo:small=0.1\"",
            "policy = \"nope\"",
            &["volume `slow`", "policy", "nope"],
        ),
        (
            "flush = \"lazy\"",
            "flush = \"sometimes\"",
            &["volume `slow`", "flush"],
        ),
        (
            "cache_size = \"1MiB\"",
            "cache_size = \"1MiB\"\ncache_array = [\"b.img\"]",
            &["volume `slow`", "cache_size", "cache_array", "whole"],
        ),
        (
            "cache_size = \"1MiB\"",
            "cache_array = [\"b.img\"]\nmirror_percent = 70",
            &["volume `slow`", "mirror_percent", "70", "1..=50"],
        ),
        (
            "cache_size = \"1MiB\"",
            "cache_array = [\"\"]",
            &["volume `slow`", "cache_array", "entry 1 is empty"],
        ),
        (
            "cache_size = \"1MiB\"",
            "cache_size = \"1KiB\"",
            &["volume `slow`", "cache_size", "no line"],
        ),
        (
            "cache_size = \"1MiB\"",
            "cache_size = \"lots\"",
            &["volume `slow`", "cache_size"],
        ),
        (
            "cache_size = \"1MiB\"",
            "cache_size = \"1MiB\"\ncache_size_max = \"512KiB\"",
            &[
                "volume `slow`",
                "cache_size_max",
                "512KiB is less than",
                "cache_size",
            ],
        ),
        (
            "cache_size = \"1MiB\"",
            "cache_size_max = \"4MiB\"",
            &["volume `slow`", "cache_size_max", "only with", "cache_size"],
        ),
        (
            "cache_size = \"1MiB\"",
            "cache_size = 1048576",
            &["volume `slow`", "cache_size", "1048576B for bytes or 1MiB"],
        ),
        (
            "cache_size = \"1MiB\"",
            "cache_size = \"1GB\"",
            &["volume `slow`", "cache_size", "ambiguous", "1GiB"],
        ),
        (
            "cache_size = \"1MiB\"",
            "cache_size = -1",
            &["cache_size", "negative"],
        ),
        (
            "export = \"slow\"",
            "export = \"fast\"",
            &["volume `fast`", "export", "unique"],
        ),
        ("export = \"slow\"", "export = \"\"", &["export", "empty"]),
        (
            "d/cache-slow.img",
            "d/./cache-fast.img",
            &[
                "volumes `fast` and `slow`",
                "share the cache d/cache-fast.img",
                "cache_size",
            ],
        ),
        (
            "d/cache-slow.img",
            "d/fast.img",
            &["volume `slow`", "cache", "backend"],
        ),
        (
            "nbd+unix:///?socket=/tmp/x.sock",
            "d/fast.img",
            &["volume `slow`: backend", "share a backend"],
        ),
        (
            "listen = \"127.0.0.1:0\"",
            "listen = \"nowhere\"",
            &["server.listen", "nowhere"],
        ),
        ("direct = true", "direct = \"yes\"", &["direct"]),
        ("cache = \"d/cache-slow.img\"\n", "", &["missing", "cache"]),
    ] {
        let text = TWO.replacen(from, to, 1);
        assert_ne!(text, TWO, "{from}");
        let e = err(&text);
        assert!(e.starts_with("conf.toml"), "{e}");
        for n in needles {
            assert!(e.contains(n), "{from} -> {to}: `{n}` not in: {e}");
        }
    }
}

#[test]
fn a_listener_and_a_volume_are_required() {
    let e = err(
        "[server]\nadmin_socket = \"a.sock\"\n[[volume]]\nexport = \"a\"\nbackend = \"b\"\ncache = \"c\"\n",
    );
    assert!(e.contains("no listener"), "{e}");
    let e = err("[server]\nsocket = \"a.sock\"\n");
    assert!(e.contains("no volume"), "{e}");
    let e = err("[server]\nsocket = \"a.sock\"\nadmin_socket = \"./a.sock\"\n[[volume]]\nexport = \"a\"\nbackend = \"b\"\ncache = \"c\"\n");
    assert!(e.contains("admin_socket"), "{e}");
}

const SHARED: &str = r#"
[server]
socket = "d/iocache.sock"

[[volume]]
export = "a"
backend = "d/a.img"
cache = "d/cache.img"
cache_size = "4MiB"
write_policy = "wt"
direct = true

[[volume]]
export = "b"
backend = "d/b.img"
cache = "./d/cache.img"
policy = "arc"

[[volume]]
export = "c"
backend = "d/c.img"
cache = "d/other-cache.img"
"#;

#[test]
fn volumes_naming_one_cache_share_its_keys() {
    let c = from_toml_str(SHARED, "conf.toml").unwrap();
    assert_eq!(
        (c.caches.len(), c.members(0), c.members(1)),
        (2, vec![0, 1], vec![2])
    );
    let (a, b, other) = (cache_of(&c, 0), cache_of(&c, 1), cache_of(&c, 2));
    for v in [a, b] {
        assert_eq!(v.cache_bytes, Some(4 << 20), "{:?}", v.path);
        assert_eq!(v.write_policy, WritePolicy::WriteThrough);
        assert_eq!(v.policy.to_string(), "arc");
        assert!(v.direct);
        assert_eq!(v.io, IoMode::Uring, "auto follows the shared direct");
    }
    // A volume of another cache keeps its own (default) settings.
    assert_eq!(other.write_policy, WritePolicy::WriteBack);
    assert!(!other.direct && other.io == IoMode::Psync);
    // The same value twice is fine.
    let twice = SHARED.replace("policy = \"arc\"", "policy = \"arc\"\nwrite_policy = \"wt\"");
    assert!(from_toml_str(&twice, "conf.toml").is_ok());
}

const WITH_CACHE_TABLE: &str = r#"
[server]
socket = "d/iocache.sock"

[[cache]]
path = "d/cache.img"
cache_size = "4MiB"
write_policy = "wt"
direct = true

[[volume]]
export = "a"
backend = "d/a.img"
cache = "d/cache.img"

[[volume]]
export = "b"
backend = "d/b.img"
cache = "./d/cache.img"

[[volume]]
export = "other"
backend = "d/other.img"
cache = "d/other-cache.img"
"#;

#[test]
fn a_cache_table_describes_the_cache_its_volumes_name() {
    let c = from_toml_str(WITH_CACHE_TABLE, "conf.toml").unwrap();
    assert_eq!(
        (c.caches.len(), c.members(0), c.members(1)),
        (2, vec![0, 1], vec![2])
    );
    let shared = cache_of(&c, 0);
    assert_eq!(shared.path, Path::new("d/cache.img"));
    assert_eq!(shared.cache_bytes, Some(4 << 20));
    assert_eq!(shared.write_policy, WritePolicy::WriteThrough);
    assert!(shared.direct && shared.io == IoMode::Uring);
    assert_eq!(cache_of(&c, 2).write_policy, WritePolicy::WriteBack);
}

#[test]
fn a_cache_table_is_the_one_place_of_its_keys() {
    let in_volume = WITH_CACHE_TABLE.replace("export = \"b\"\n", "export = \"b\"\nline_size = \"8KiB\"\n");
    let e = err(&in_volume);
    assert!(
        e.contains("volume `b`: line_size: the cache d/cache.img has its own [[cache]] table"),
        "{e}"
    );
    for (line, want) in [
        ("export = \"x\"", "cache `d/cache.img`: export: a key of a volume"),
        (
            "speed = 2",
            "cache `d/cache.img`: speed: not a key of a cache; the keys of a cache are path, cache_size",
        ),
        ("line_size = \"3KiB\"", "cache `d/cache.img`: line_size"),
        ("promotion = \"fast\"", "cache `d/cache.img`: promotion"),
    ] {
        let text = WITH_CACHE_TABLE.replace("direct = true\n", &format!("direct = true\n{line}\n"));
        let e = err(&text);
        assert!(e.contains(want), "{line}: {e}");
    }
    let e = err(&WITH_CACHE_TABLE.replace("path = \"d/cache.img\"\n", ""));
    assert!(e.contains("cache 1: path: required"), "{e}");
    let unused = format!("{WITH_CACHE_TABLE}\n[[cache]]\npath = \"d/spare.img\"\n");
    let e = err(&unused);
    assert!(
        e.contains("cache `d/spare.img`: path: no volume names this cache"),
        "{e}"
    );
    let twice = format!("{WITH_CACHE_TABLE}\n[[cache]]\npath = \"d/./cache.img\"\n");
    let e = err(&twice);
    assert!(e.contains("a second [[cache]] table for the same device"), "{e}");
}

#[test]
fn adapt_parses_and_is_shared_by_a_cache() {
    let a = parse_adapt("lbica:hold=3", Some("50ms")).unwrap();
    assert_eq!(a.text, "lbica:hold=3 every 50ms");
    assert_eq!(a.config.interval_ns, 50_000_000);
    match a.config.controller {
        BalanceController::Lbica(c) => assert_eq!(c.min_hold_intervals, 3),
        other => panic!("{other:?}"),
    }
    let s = parse_adapt("sib:margin=2:interval=20ms", None).unwrap();
    assert_eq!(
        (s.text.as_str(), s.config.interval_ns),
        ("sib:margin=2 every 20ms", 20_000_000)
    );
    assert_eq!(
        parse_adapt("sib", None).unwrap().config.interval_ns,
        DEFAULT_ADAPT_INTERVAL_NS
    );
    for (spec, interval, why) in [
        ("observe", None, "simulator"),
        ("reca", None, "unknown controller"),
        ("lbica:interval=10ms", Some("20ms"), "give one"),
        ("lbica", Some("100"), "unit"),
        ("lbica", Some("0s"), "positive"),
        ("sib:hold=2", None, "unknown key"),
    ] {
        let e = format!("{:#}", parse_adapt(spec, interval).unwrap_err());
        assert!(e.contains(why), "{spec}: {e}");
    }
    // A key of the cache: written in one volume, both have it.
    let shared = SHARED.replace(
        "direct = true",
        "direct = true\nadapt = \"lbica\"\nadapt_interval = \"50ms\"",
    );
    let c = from_toml_str(&shared, "conf.toml").unwrap();
    assert_eq!(cache_of(&c, 1).adapt, cache_of(&c, 0).adapt);
    assert_eq!(
        cache_of(&c, 0).adapt.as_ref().unwrap().config.interval_ns,
        50_000_000
    );
    assert_eq!(cache_of(&c, 2).adapt, None);
    let e = err(&SHARED.replace("direct = true", "direct = true\nadapt_interval = \"50ms\""));
    assert!(e.contains("adapt_interval: only with"), "{e}");
    let e = err(&SHARED.replace("direct = true", "direct = true\nadapt = \"fast\""));
    assert!(e.contains("volume `a`: adapt") && e.contains("fast"), "{e}");
}

#[test]
fn write_back_gap_is_a_size_of_the_cache() {
    let c = from_toml_str(SHARED, "conf.toml").unwrap();
    assert_eq!(cache_of(&c, 0).write_back_gap_bytes, 0);
    let shared = SHARED.replace("direct = true", "direct = true\nwrite_back_gap = \"256KiB\"");
    let c = from_toml_str(&shared, "conf.toml").unwrap();
    assert_eq!(
        (
            cache_of(&c, 0).write_back_gap_bytes,
            cache_of(&c, 1).write_back_gap_bytes
        ),
        (256 << 10, 256 << 10)
    );
    let e = err(&SHARED.replace("direct = true", "direct = true\nwrite_back_gap = \"lots\""));
    assert!(e.contains("volume `a`: write_back_gap: "), "{e}");
}

#[test]
fn clean_check_budget_is_a_duration_of_the_cache() {
    let c = from_toml_str(SHARED, "conf.toml").unwrap();
    assert_eq!(cache_of(&c, 0).clean_check_budget_ns, 60_000_000_000);
    // Written in one volume, both volumes of the cache have it.
    let shared = SHARED.replace("direct = true", "direct = true\nclean_check_budget = \"0s\"");
    let c = from_toml_str(&shared, "conf.toml").unwrap();
    assert_eq!(
        (
            cache_of(&c, 0).clean_check_budget_ns,
            cache_of(&c, 1).clean_check_budget_ns
        ),
        (0, 0)
    );
    let e = err(&SHARED.replace("direct = true", "direct = true\nclean_check_budget = \"60\""));
    assert!(
        e.contains("volume `a`: clean_check_budget: ") && e.contains("unit"),
        "{e}"
    );
}

#[test]
fn a_disagreement_on_a_shared_cache_names_the_file_both_volumes_and_the_key() {
    for (key, addition, shown) in [
        ("write_policy", "write_policy = \"wb\"", "`wt` and `wb`"),
        (
            "line_size",
            "line_size = \"64KiB\"\ncache_size = \"4MiB\"",
            "`4KiB` and `64KiB`",
        ),
        ("cache_size", "cache_size = \"8MiB\"", "`4MiB` and `8MiB`"),
        ("direct", "direct = false", "`true` and `false`"),
        ("flush", "flush = \"lazy\"", "flush"),
        ("persistence", "persistence = \"all\"", "`dirty` and `all`"),
    ] {
        // Written in `a` (or by default in `a` for line_size and persistence).
        let mut text = SHARED.replace("policy = \"arc\"", &format!("policy = \"arc\"\n{addition}"));
        if key == "line_size" {
            text = text.replacen(
                "cache_size = \"4MiB\"",
                "cache_size = \"4MiB\"\nline_size = \"4KiB\"",
                1,
            );
        }
        if key == "persistence" {
            text = text.replacen("direct = true", "direct = true\npersistence = \"dirty\"", 1);
        }
        if key == "flush" {
            text = text.replacen("direct = true", "direct = true\nflush = \"nop\"", 1);
        }
        let e = err(&text);
        assert!(e.starts_with("conf.toml: "), "{e}");
        for needle in ["volumes `a` and `b`", key, "d/cache.img"] {
            assert!(e.contains(needle), "{key}: `{needle}` not in: {e}");
        }
        assert!(e.contains(shown), "{key}: `{shown}` not in: {e}");
    }
    // A cache file cannot be another volume's backend.
    let e = err(&SHARED.replace("\"./d/cache.img\"", "\"d/a.img\""));
    assert!(e.contains("volume `b`: cache") && e.contains("backend"), "{e}");
}

#[test]
fn flags_name_flags() {
    let text = VolumeText {
        export: "iocache".into(),
        backend: "b.img".into(),
        backend_size: None,
        backend_id: None,
        cache: "c.img".into(),
        cache_array: Vec::new(),
        mirror_percent: 25,
        cache_size: None,
        cache_size_max: None,
        line_size: SizeText("3000B".into()),
        write_policy: "wb".into(),
        promotion: "always".into(),
        policy: "lru".into(),
        lookup: "fine".into(),
        flush: "nop".into(),
        write_miss_bypass: false,
        ordered_write_back: false,
        max_dirty_lines: None,
        seq_cutoff: "off".into(),
        readahead: "off".into(),
        fill: "request".into(),
        io_engine: "auto".into(),
        direct: false,
        persistence: "dirty".into(),
        clean_check_budget: None,
        write_back_gap: None,
        commit_interval: None,
        read_only: false,
        discard: None,
        adapt: None,
        adapt_interval: None,
        reca_table: None,
        reca_window: None,
        reca_line_size: None,
    };
    let e = format!("{:#}", text.validate(&Origin::Flags).unwrap_err());
    assert!(e.starts_with("--line-size: "), "{e}");
}

#[test]
fn reca_keys_are_cache_keys_and_checked() {
    // Written in one volume of a shared cache: the cache's.
    let shared = SHARED.replace(
        "policy = \"arc\"",
        "policy = \"arc\"\nadapt = \"reca\"\nreca_window = 5000\nreca_table = \"t.toml\"",
    );
    let c = from_toml_str(&shared, "conf.toml").unwrap();
    let want = Some(RecaConfig {
        table: Some("t.toml".into()),
        window_requests: 5000,
        line_size_live: true,
    });
    assert_eq!(cache_of(&c, 0).reca, want);
    assert_eq!(cache_of(&c, 1).reca, want);
    assert_eq!(cache_of(&c, 2).reca, None);
    // lbica is a controller too, so ReCA's keys beside it are refused,
    // and so is an unknown one (naming every choice).
    let e = err(&SHARED.replace("policy = \"arc\"", "adapt = \"lbica\"\nreca_window = 10"));
    assert!(e.contains("volume `b`: reca_window: only with ReCA"), "{e}");
    let e = err(&SHARED.replace("policy = \"arc\"", "adapt = \"nope\""));
    assert!(
        e.contains("volume `b`: adapt: unknown controller `nope`; expected off, reca"),
        "{e}"
    );
    let e = err(&SHARED.replace("policy = \"arc\"", "adapt = \"reca\"\nadapt_interval = \"1s\""));
    assert!(
        e.contains("volume `b`: adapt_interval: only with a load balancer"),
        "{e}"
    );
    let c = from_toml_str(
        &SHARED.replace("policy = \"arc\"", "adapt = \"lbica\""),
        "conf.toml",
    )
    .unwrap();
    assert!(cache_of(&c, 0).adapt.is_some() && cache_of(&c, 0).reca.is_none());
    let e = err(&SHARED.replace("policy = \"arc\"", "adapt = \"reca\"\nreca_window = 0"));
    assert!(e.contains("volume `b`: reca_window"), "{e}");
    let e = err(&SHARED.replace("policy = \"arc\"", "reca_window = 10"));
    assert!(e.contains("volume `b`: reca_window: only with ReCA"), "{e}");
    // When ReCA's line size is put in force.
    let e = err(&SHARED.replace("policy = \"arc\"", "reca_line_size = \"live\""));
    assert!(e.contains("volume `b`: reca_line_size: only with ReCA"), "{e}");
    let e = err(&SHARED.replace("policy = \"arc\"", "adapt = \"reca\"\nreca_line_size = \"later\""));
    assert!(
        e.contains("volume `b`: reca_line_size: `later` is not live or next_start"),
        "{e}"
    );
    let c = from_toml_str(
        &SHARED.replace(
            "policy = \"arc\"",
            "adapt = \"reca\"\nreca_line_size = \"next_start\"",
        ),
        "conf.toml",
    )
    .unwrap();
    assert!(!cache_of(&c, 0).reca.as_ref().unwrap().line_size_live);
    // Two volumes of one cache disagreeing.
    let e = err(&SHARED
        .replace("direct = true", "direct = true\nadapt = \"reca\"")
        .replace("policy = \"arc\"", "adapt = \"off\""));
    assert!(e.contains("adapt"), "{e}");
}

#[test]
fn a_listener_is_an_address_or_a_host_name_with_a_port() {
    assert_eq!(
        parse_listen("127.0.0.1:10809", "--listen").unwrap(),
        "127.0.0.1:10809".parse().unwrap()
    );
    assert!(parse_listen("localhost:10809", "--listen")
        .unwrap()
        .ip()
        .is_loopback());
    let e = parse_listen("localhost", "--listen").unwrap_err().to_string();
    assert!(
        e.contains("--listen: `localhost`: expected ADDR:PORT or HOST:PORT"),
        "{e}"
    );
}
