//! Behaviour of the reader common to all formats: detection through
//! `from_reader`/`open`, error reporting and termination, skip mode, line
//! numbering with CRLF and blank lines, over-long lines, and progress.

use iocache_trace::{ReaderOptions, TraceError, TraceFormat, TraceReader, MAX_LINE_BYTES};

fn open(text: &[u8], format: Option<TraceFormat>, skip: bool) -> Result<TraceReader, TraceError> {
    TraceReader::from_bytes("input", text, format, ReaderOptions { skip_bad_lines: skip })
}

#[test]
fn detects_each_format_example() {
    let examples: [(&str, TraceFormat); 11] = [
        (
            "128166385295514663,hm,0,Write,9056014336,2048,2833\n",
            TraceFormat::Msr,
        ),
        (
            "Timestamp,Response,IOType,LUN,Offset,Size\n1456095145.1,0.1,R,0,0,512\n",
            TraceFormat::Systor,
        ),
        ("1538323200,4247200,128,1,1058\n", TraceFormat::Tencent),
        (
            "89312454701617 4892 syslogd 904265560 8 W 6 0 531e779e4ec1ae9ad2fb3ebfa7f4dd1b\n",
            TraceFormat::Fiu,
        ),
        (
            "version,time,op,size,lbn\n1,5633898,2a,512,42932745\n",
            TraceFormat::VscsiCsv,
        ),
        ("938513000 4 264719034 16 0\n", TraceFormat::Disksim),
        ("3050771 25 0 0\n", TraceFormat::Arc),
        (
            "  8,0    3        1     0.000000000   697  Q  WS 3417048 + 8 [kjournald]\n",
            TraceFormat::BLKPARSE,
        ),
        (
            "fio version 2 iolog\n/dev/sda add\n/dev/sda read 0 512\n",
            TraceFormat::Fio,
        ),
        (
            "fio version 3 iolog\n0 /dev/sda add\n5 /dev/sda read 0 512\n",
            TraceFormat::Fio,
        ),
        ("# lbas\n17\n18\n", TraceFormat::LBA),
    ];
    for (text, format) in examples {
        let mut reader = open(text.as_bytes(), None, false).unwrap();
        assert_eq!(reader.format(), format, "{text}");
        let records: Vec<_> = reader.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!(
            records.len(),
            1 + usize::from(format == TraceFormat::LBA),
            "{text}"
        );
    }
}

#[test]
fn detection_failures_name_candidates() {
    let err = open(b"3050771 25 0 0\n938513000 4 264719034 16 0\n", None, false).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, TraceError::UnknownFormat { .. }));
    assert!(
        text.starts_with("input: cannot determine the trace format"),
        "{text}"
    );
    assert!(text.contains("arc") && text.contains("disksim"), "{text}");
    assert!(text.contains("--format"), "{text}");

    let err = open(b"what is this\n", None, false).unwrap_err().to_string();
    assert!(err.contains("no known format"), "{err}");
    let err = open(b"", None, false).unwrap_err().to_string();
    assert!(err.contains("no non-empty lines"), "{err}");
    let err = open(b"\xfd7zXZ\x00\x00binary", None, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("binary"), "{err}");
}

#[test]
fn detection_lookahead_lines_are_still_parsed() {
    let mut text = String::from("\n\n");
    for i in 0..50 {
        text.push_str(&format!("{i} 8 0 {i}\r\n"));
        if i % 7 == 0 {
            text.push('\n');
        }
    }
    let mut reader = open(text.as_bytes(), None, false).unwrap();
    let records: Vec<_> = reader.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(records.len(), 50);
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.offset_bytes, i as u64 * 512);
    }
    assert_eq!(reader.lines_read(), 2 + 50 + 8);
}

#[test]
fn error_line_numbers_count_blank_and_crlf_lines() {
    let text = b"1 8 0 0\r\n\r\n\n  \n2 8 0 1\r\nbad 8 0 1\r\n3 8 0 2\r\n";
    let mut reader = open(text, Some(TraceFormat::Arc), false).unwrap();
    assert!(reader.next().unwrap().is_ok());
    assert!(reader.next().unwrap().is_ok());
    match reader.next() {
        Some(Err(TraceError::Parse {
            line, field, path, ..
        })) => {
            assert_eq!((line, field, path.as_str()), (6, "start_sector", "input"));
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
    assert!(reader.next().is_none());
    assert!(reader.next().is_none());
}

#[test]
fn skip_mode_counts_and_continues() {
    let text = b"1 8 0 0\nbad\n2 8 0 1\n3 0 0 2\n4 8 0 3\n";
    let mut reader = open(text, Some(TraceFormat::Arc), true).unwrap();
    let records: Vec<_> = reader.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(records.len(), 3);
    assert_eq!(reader.skipped_lines(), 2);
    assert_eq!(reader.records_read(), 3);
}

#[test]
fn last_line_without_newline() {
    let mut reader = open(b"1 8 0 0\n2 8 0 1", None, false).unwrap();
    assert_eq!(reader.by_ref().count(), 2);
}

#[test]
fn overlong_lines_are_malformed() {
    let mut text = b"1 8 0 0\n".to_vec();
    text.extend(std::iter::repeat_n(b'7', MAX_LINE_BYTES as usize + 10));
    text.extend(b"\n2 8 0 1\n");
    let mut reader = open(&text, Some(TraceFormat::Arc), false).unwrap();
    assert!(reader.next().unwrap().is_ok());
    match reader.next() {
        Some(Err(TraceError::Parse { line, field, .. })) => assert_eq!((line, field), (2, "line")),
        other => panic!("{other:?}"),
    }
    let mut reader = open(&text, Some(TraceFormat::Arc), true).unwrap();
    let records: Vec<_> = reader.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(reader.skipped_lines(), 1);
    assert_eq!(reader.lines_read(), 3);
}

#[test]
fn open_reports_missing_file_and_size() {
    let err =
        TraceReader::open("/nonexistent/trace.csv".as_ref(), None, ReaderOptions::default()).unwrap_err();
    assert!(matches!(err, TraceError::Io { .. }));
    assert!(err.to_string().starts_with("/nonexistent/trace.csv: "), "{err}");

    let dir = std::env::temp_dir().join(format!("iocache-trace-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.lis");
    std::fs::write(&path, b"1 8 0 0\n2 8 0 1\n").unwrap();
    let mut reader = TraceReader::open(&path, None, ReaderOptions::default()).unwrap();
    assert_eq!(reader.input_len(), Some(16));
    assert_eq!(reader.by_ref().count(), 2);
    assert_eq!(reader.input_bytes_consumed(), 16);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reader_is_send() {
    fn assert_send<T: Send>() {}
    assert_send::<TraceReader>();
}

/// Hands out its data a few bytes per `read` call, so lines (and CRLF pairs)
/// straddle buffer refills.
struct Chunky {
    data: Vec<u8>,
    pos: usize,
    chunk: usize,
}

impl std::io::Read for Chunky {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.chunk.min(buf.len()).min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..n + self.pos]);
        self.pos += n;
        Ok(n)
    }
}

#[test]
fn lines_straddling_reads() {
    let mut text = Vec::new();
    for i in 0..300u64 {
        text.extend(format!("{} 8 0 {i}\r\n", i * 3).as_bytes());
        if i % 11 == 0 {
            text.extend(b"\r\n   \n");
        }
    }
    let expected: Vec<_> = open(&text, None, false)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(expected.len(), 300);
    for chunk in [1, 2, 3, 7, 13, 64] {
        for format in [None, Some(TraceFormat::Arc)] {
            let reader = TraceReader::from_reader(
                "chunky",
                Box::new(Chunky {
                    data: text.clone(),
                    pos: 0,
                    chunk,
                }),
                format,
                ReaderOptions::default(),
            )
            .unwrap();
            let got: Vec<_> = reader.collect::<Result<_, _>>().unwrap();
            assert_eq!(got, expected, "chunk {chunk}");
        }
    }
}
