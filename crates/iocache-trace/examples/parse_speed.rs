//! Measures how fast a trace is read, to check the reader keeps well ahead
//! of the simulator (which consumes ~13M records/s).
//!
//! `cargo run --release -p iocache-trace --example parse_speed [PATH] [FORMAT]`
//!
//! PATH defaults to the ARC P2 sample in `../shared/traces`. Prints the time
//! for (1) reading the file end to end, decompression included, and (2)
//! parsing the already decompressed text from memory.

use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use iocache_trace::{ReaderOptions, TraceFormat, TraceReader};

fn run(reader: TraceReader) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let mut records = 0u64;
    let mut bytes = 0u64;
    let mut reader = reader;
    for record in reader.by_ref() {
        let record = record?;
        records += 1;
        bytes = bytes.wrapping_add(record.length_bytes);
    }
    std::hint::black_box(bytes);
    Ok((records, reader.lines_read()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/traces/arc-P2.lis.zst"
        ))
    });
    let format: Option<TraceFormat> = args.next().map(|f| f.parse()).transpose()?;
    let options = ReaderOptions::default();

    let start = Instant::now();
    let reader = TraceReader::open(&path, format, options)?;
    let detected = reader.format();
    let (records, lines) = run(reader)?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}: format {detected}, {records} records, {lines} lines",
        path.display()
    );
    println!(
        "  file (with decompression): {:.3} s, {:.2} M records/s, {:.2} M lines/s",
        secs,
        records as f64 / secs / 1e6,
        lines as f64 / secs / 1e6
    );

    // Parse speed alone: decompress into memory first.
    let mut text = Vec::new();
    let file = std::fs::File::open(&path)?;
    let mut magic = [0u8; 4];
    std::fs::File::open(&path)?.read_exact(&mut magic).ok();
    let mut decoder: Box<dyn Read> = match iocache_trace::Compression::sniff(&magic) {
        iocache_trace::Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(file)?),
        iocache_trace::Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(file)),
        iocache_trace::Compression::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(file)),
        iocache_trace::Compression::None => Box::new(file),
    };
    decoder.read_to_end(&mut text)?;
    let text_len = text.len();
    let start = Instant::now();
    let reader = TraceReader::from_bytes("memory", text, Some(detected), options)?;
    let (records, lines) = run(reader)?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "  in memory ({:.1} MB of text): {:.3} s, {:.2} M records/s, {:.2} M lines/s",
        text_len as f64 / 1e6,
        secs,
        records as f64 / secs / 1e6,
        lines as f64 / secs / 1e6
    );
    Ok(())
}
