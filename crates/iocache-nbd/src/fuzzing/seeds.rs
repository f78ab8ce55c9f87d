//! Hand-made starting inputs of the fuzz targets, one per command,
//! option and error path, which the tests also run as fixed cases.

use super::*;

/// A starting input for a fuzz target (and a fixed case of the tests).
#[derive(Debug, Clone)]
pub struct Seed {
    /// `nbd_request` (input for [`transmission`]) or `nbd_handshake`
    /// (input for [`session`]).
    pub target: &'static str,
    pub name: &'static str,
    pub input: Vec<u8>,
}

/// A request header followed by `payload`.
pub fn request(command: u16, flags: u16, handle: u64, offset: u64, length: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = RequestHeader {
        flags,
        command,
        handle,
        offset,
        length,
    }
    .encode()
    .to_vec();
    v.extend_from_slice(payload);
    v
}

/// Hand-made inputs covering every command, option and error path once.
pub fn seeds() -> Vec<Seed> {
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let basic = [
        request(NBD_CMD_WRITE, 0, 1, 0, 4096, &data),
        request(NBD_CMD_READ, 0, 2, 0, 4096, &[]),
        request(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 3, 8192, 512, &data[..512]),
        request(NBD_CMD_FLUSH, 0, 4, 0, 0, &[]),
        request(NBD_CMD_TRIM, NBD_CMD_FLAG_FUA, 5, 4096, 4096, &[]),
        request(
            NBD_CMD_WRITE_ZEROES,
            NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO,
            6,
            0,
            1024,
            &[],
        ),
        request(NBD_CMD_READ, 0, 7, 0, 8192, &[]),
        request(NBD_CMD_READ, 0, 8, 0, 0, &[]),
        request(NBD_CMD_DISC, 0, 9, 0, 0, &[]),
    ]
    .concat();
    let errors = [
        request(NBD_CMD_READ, NBD_CMD_FLAG_DF, 1, 0, 512, &[]),
        request(NBD_CMD_READ, 0, 2, (128 << 10) - 512, 1024, &[]),
        request(NBD_CMD_READ, 0, 3, 100, 512, &[]),
        request(NBD_CMD_READ, 0, 4, 0, MAX_REQUEST + 1, &[]),
        request(NBD_CMD_READ, 0, 5, u64::MAX - 511, 512, &[]),
        request(NBD_CMD_WRITE, 1 << 9, 6, 0, 512, &data[..512]),
        request(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_DF, 7, 0, 512, &[]),
        request(NBD_CMD_BLOCK_STATUS, 0, 8, 0, 512, &[]),
        request(99, 0, 9, 0, 0, &[]),
        request(NBD_CMD_WRITE, 0, 10, u64::MAX, 16, &data[..16]),
        request(NBD_CMD_WRITE_ZEROES, 0, 11, 1 << 20, 512, &[]),
        request(NBD_CMD_READ, 0, 12, 4096, 512, &[]),
        request(
            NBD_CMD_WRITE,
            0,
            13,
            0,
            MAX_REQUEST + 1,
            &vec![0x5a; MAX_REQUEST as usize + 1],
        ),
        // Above the maximum block size: served in pieces.
        request(
            NBD_CMD_WRITE,
            0,
            14,
            0,
            2 * MAX_PAYLOAD,
            &vec![0xa5; 2 * MAX_PAYLOAD as usize],
        ),
        request(NBD_CMD_READ, 0, 15, 0, 2 * MAX_PAYLOAD, &[]),
    ]
    .concat();
    let read_only = [
        request(NBD_CMD_WRITE, 0, 1, 0, 4096, &data),
        request(NBD_CMD_TRIM, 0, 2, 0, 4096, &[]),
        request(NBD_CMD_WRITE_ZEROES, 0, 3, 0, 4096, &[]),
        request(NBD_CMD_READ, 0, 4, 4096, 16384, &[]),
        request(NBD_CMD_READ, 0, 5, 0, 32768, &[]),
        request(NBD_CMD_READ, 0, 6, 512, 4096, &[]),
    ]
    .concat();
    let tiny = [
        request(NBD_CMD_WRITE, 0, 1, 3, 997, &data[..997]),
        request(NBD_CMD_READ, 0, 2, 1, 999, &[]),
        request(NBD_CMD_READ, 0, 3, 0, 1001, &[]),
        request(NBD_CMD_WRITE_ZEROES, 0, 4, 2999, 1, &[]),
        request(NBD_CMD_READ, 0, 5, 2990, 10, &[]),
        request(NBD_CMD_READ, 0, 6, 2999, 2, &[]),
    ]
    .concat();
    // A transmission input starts with the byte that picks the setup.
    let transmission = |name, setup: u8, body: &[u8]| Seed {
        target: "nbd_request",
        name,
        input: [&[setup][..], body].concat(),
    };
    let mut v = vec![
        transmission("basic-simple", 0x00, &basic),
        transmission("basic-structured", 0x01, &basic),
        transmission("errors-structured", 0x03, &errors),
        transmission("errors-simple", 0x02, &errors),
        transmission("read-only", 0x05, &read_only),
        transmission("tiny-export-name", 0x1e, &tiny),
        transmission("bad-magic", 0x01, &[&basic[..40], &[0u8; 28][..]].concat()),
    ];
    let info = |option: u32, name: &str, requests: &[u16]| {
        encode_option(
            option,
            &InfoRequest {
                name: name.into(),
                requests: requests.to_vec(),
            }
            .encode(),
        )
    };
    let all_info = [
        NBD_INFO_EXPORT,
        NBD_INFO_NAME,
        NBD_INFO_DESCRIPTION,
        NBD_INFO_BLOCK_SIZE,
        77,
    ];
    let fixed = (NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    let mut too_big = IHAVEOPT.to_be_bytes().to_vec();
    too_big.extend(NBD_OPT_LIST.to_be_bytes());
    too_big.extend((MAX_OPTION_LEN + 1).to_be_bytes());
    too_big.extend(vec![0u8; MAX_OPTION_LEN as usize + 1]);
    let haggle = [
        fixed.clone(),
        encode_option(NBD_OPT_LIST, &[]),
        encode_option(NBD_OPT_LIST, b"x"),
        info(NBD_OPT_INFO, "", &all_info),
        info(NBD_OPT_INFO, "nope", &[]),
        encode_option(NBD_OPT_INFO, b"\0\0\0\x09disk"),
        encode_option(NBD_OPT_STRUCTURED_REPLY, &[]),
        encode_option(NBD_OPT_STRUCTURED_REPLY, &[]),
        encode_option(NBD_OPT_STARTTLS, &[]),
        encode_option(NBD_OPT_SET_META_CONTEXT, &[0; 8]),
        encode_option(0xdead_beef, b"junk"),
        too_big,
        info(NBD_OPT_GO, "disk", &all_info),
        basic.clone(),
    ]
    .concat();
    let handshake = |name, input| Seed {
        target: "nbd_handshake",
        name,
        input,
    };
    v.extend([
        handshake("haggle-then-go", haggle),
        handshake(
            "export-name-zeroes",
            [
                NBD_FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec(),
                encode_option(NBD_OPT_EXPORT_NAME, b"tiny"),
                tiny,
            ]
            .concat(),
        ),
        handshake(
            "abort",
            [fixed.clone(), encode_option(NBD_OPT_ABORT, &[])].concat(),
        ),
        handshake(
            "block-status",
            [
                fixed.clone(),
                encode_option(NBD_OPT_LIST_META_CONTEXT, &meta_context("disk", &[])),
                encode_option(NBD_OPT_STRUCTURED_REPLY, &[]),
                encode_option(
                    NBD_OPT_SET_META_CONTEXT,
                    &meta_context("disk", &["base:allocation"]),
                ),
                info(NBD_OPT_GO, "disk", &[]),
                request(NBD_CMD_BLOCK_STATUS, 0, 1, 0, 4096, &[]),
                request(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_REQ_ONE, 2, 512, 1024, &[]),
                request(NBD_CMD_BLOCK_STATUS, 0, 3, 0, 0, &[]),
                request(NBD_CMD_BLOCK_STATUS, 0, 4, 1 << 40, 512, &[]),
                request(NBD_CMD_DISC, 0, 5, 0, 0, &[]),
            ]
            .concat(),
        ),
        handshake("go-read-only", [handshake_prefix(0x05), read_only].concat()),
        handshake(
            "unknown-export-name",
            [fixed, encode_option(NBD_OPT_EXPORT_NAME, b"nope")].concat(),
        ),
    ]);
    v
}
