//! Writes the fuzz targets' seed inputs (`iocache_nbd::fuzzing::seeds`)
//! into `DIR/<target>/<name>`, the layout of `fuzz/corpus`:
//!
//! ```sh
//! cargo run -p iocache-nbd --example fuzz_seeds -- fuzz/corpus
//! ```

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: fuzz_seeds DIR");
        std::process::exit(2);
    };
    for seed in iocache_nbd::fuzzing::seeds() {
        let target = dir.join(seed.target);
        std::fs::create_dir_all(&target)?;
        std::fs::write(target.join(format!("seed-{}", seed.name)), &seed.input)?;
    }
    Ok(())
}
