//! Checks that gzip, zstd and bzip2 input is decompressed transparently
//! (including concatenated members/frames/streams) and detected by content,
//! since published traces come compressed in all three ways.

use std::io::{Cursor, Write};

use iocache_trace::{Compression, IoKind, ReaderOptions, TraceFormat, TraceReader, TraceRecord};

const TEXT: &str = "Timestamp,Response,IOType,LUN,Offset,Size\n\
                    1456095145.133076000,0.000806000,R,0,899056122368,131072\n\
                    1456095145.126285000,0.008044000,W,2,4256049987072,122880\n";

fn expected() -> Vec<TraceRecord> {
    vec![
        TraceRecord::new(1_456_095_145_133_076_000, 0, 899056122368, 131072, IoKind::Read),
        TraceRecord::new(1_456_095_145_126_285_000, 2, 4256049987072, 122880, IoKind::Write),
    ]
}

/// Compresses a byte string.
type Compressor = fn(&[u8]) -> Vec<u8>;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(Cursor::new(data), 3).unwrap()
}

fn bzip2(data: &[u8]) -> Vec<u8> {
    let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A reader of `bytes` named `name`, with the default options.
fn open(name: &str, bytes: Vec<u8>, format: Option<TraceFormat>) -> TraceReader {
    TraceReader::from_bytes(name, bytes, format, ReaderOptions::default()).unwrap()
}

fn read_all(bytes: Vec<u8>, format: Option<TraceFormat>) -> (Vec<TraceRecord>, TraceReader) {
    let mut reader = open("mem", bytes, format);
    let records = reader.by_ref().collect::<Result<Vec<_>, _>>().unwrap();
    (records, reader)
}

#[test]
fn round_trips_with_detection() {
    let cases: [(Compressor, Compression); 3] = [
        (gzip, Compression::Gzip),
        (zstd, Compression::Zstd),
        (bzip2, Compression::Bzip2),
    ];
    for (compress, compression) in cases {
        let packed = compress(TEXT.as_bytes());
        let len = packed.len() as u64;
        let (records, reader) = read_all(packed.clone(), None);
        assert_eq!(reader.compression(), compression);
        assert_eq!(reader.format(), TraceFormat::Systor);
        assert_eq!(records, expected(), "{compression:?}");
        assert_eq!(reader.input_bytes_consumed(), len, "{compression:?}");
        assert_eq!(reader.input_len(), None);
        let (records, _) = read_all(packed, Some(TraceFormat::Systor));
        assert_eq!(records, expected(), "{compression:?}");
    }
    let (records, reader) = read_all(TEXT.as_bytes().to_vec(), None);
    assert_eq!(reader.compression(), Compression::None);
    assert_eq!(records, expected());
}

#[test]
fn concatenated_streams() {
    let (head, tail) = TEXT.split_at(TEXT.find("1456095145.126").unwrap());
    for compress in [gzip as Compressor, zstd, bzip2] {
        let mut packed = compress(head.as_bytes());
        packed.extend(compress(tail.as_bytes()));
        let (records, _) = read_all(packed, None);
        assert_eq!(records, expected());
    }
}

#[test]
fn large_compressed_stream_is_streamed() {
    // 200k lines across many buffer refills.
    let mut text = String::new();
    for i in 0..200_000u64 {
        text.push_str(&format!("{} 8 0 {}\n", i * 8, i));
    }
    fn plain(data: &[u8]) -> Vec<u8> {
        data.to_vec()
    }
    for compress in [plain as Compressor, gzip, zstd, bzip2] {
        let (records, reader) = read_all(compress(text.as_bytes()), None);
        assert_eq!(reader.format(), TraceFormat::Arc);
        assert_eq!(records.len(), 200_000);
        assert_eq!(records[199_999].offset_bytes, 199_999 * 8 * 512);
        assert_eq!(records[199_999].time_ns, 199_999);
    }
}

/// A compressed trace cut short says so, with how far it got: a copy that
/// stopped part-way must not pass for a short trace.
#[test]
fn truncated_compressed_streams_say_how_far_they_got() {
    let mut text = String::new();
    for i in 0..100_000u64 {
        text.push_str(&format!("{} 8 0 {}\n", i * 8, i));
    }
    for (name, compress) in [("gzip", gzip as Compressor), ("zstd", zstd), ("bzip2", bzip2)] {
        let mut packed = compress(text.as_bytes());
        packed.truncate(packed.len() * 3 / 4);
        let mut reader = open("cut.lis", packed, Some(TraceFormat::Arc));
        let read = reader.by_ref().take_while(Result::is_ok).count() as u64;
        assert!(read > 0 && read < 100_000, "{name}: {read}");
        let mut cut = compress(text.as_bytes());
        cut.truncate(cut.len() * 3 / 4);
        let message = open("cut.lis", cut, Some(TraceFormat::Arc))
            .find_map(Result::err)
            .expect("an error")
            .to_string();
        assert!(
            message.starts_with(&format!("cut.lis: truncated after {read} requests")),
            "{name}: {message}"
        );
    }
}

#[test]
fn corrupt_compressed_stream_is_an_io_error() {
    let mut packed = gzip(TEXT.as_bytes());
    let mid = packed.len() / 2;
    packed.truncate(mid);
    let mut reader = open("broken.gz", packed, Some(TraceFormat::Systor));
    let err = reader.by_ref().find_map(Result::err).expect("an error");
    assert!(
        matches!(
            err,
            iocache_trace::TraceError::Interrupted {
                truncated: true,
                records: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(reader.next().is_none());
}
