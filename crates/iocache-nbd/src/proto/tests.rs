//! The wire format's unit tests: every header and reply encoded and parsed
//! back, and malformed ones refused.

use super::*;

fn header(flags: u16, command: u16, handle: u64, offset: u64, length: u32) -> [u8; 28] {
    let bytes = crate::fuzzing::request(command, flags, handle, offset, length, &[]);
    bytes.try_into().expect("a header alone is 28 bytes")
}

#[test]
fn request_layout_is_big_endian() {
    let b = header(0x0001, 0x0001, 0x0102030405060708, 0x1112131415161718, 0x21222324);
    assert_eq!(
        b,
        [
            0x25, 0x60, 0x95, 0x13, 0x00, 0x01, 0x00, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x12, 0x13, 0x14,
            0x15, 0x16, 0x17, 0x18, 0x21, 0x22, 0x23, 0x24
        ]
    );
}

#[test]
fn parses_every_command() {
    for (code, cmd) in [
        (0, Command::Read),
        (1, Command::Write),
        (2, Command::Disc),
        (3, Command::Flush),
        (4, Command::Trim),
        (6, Command::WriteZeroes),
        (5, Command::Cache),
        (7, Command::BlockStatus),
    ] {
        let r = RequestHeader::parse(&header(0, code, 7, 512, 4096), DEFAULT_MAX_PAYLOAD).unwrap();
        assert_eq!(r.command, cmd);
        assert_eq!((r.handle, r.offset, r.length), (7, 512, 4096));
        assert_eq!(cmd.code(), code);
    }
}

#[test]
fn rejects_bad_magic_fatally() {
    let mut b = header(0, 0, 1, 0, 512);
    b[0] = 0;
    let e = RequestHeader::parse(&b, DEFAULT_MAX_PAYLOAD).unwrap_err();
    assert_eq!(e, ProtoError::BadRequestMagic(0x0060_9513));
    assert!(e.is_fatal());
    assert_eq!(e.handle(), None);
}

#[test]
fn rejects_unknown_commands_with_einval() {
    for code in [8u16, 100, u16::MAX] {
        let e = RequestHeader::parse(&header(0, code, 9, 0, 0), DEFAULT_MAX_PAYLOAD).unwrap_err();
        assert_eq!(
            e,
            ProtoError::UnknownCommand {
                handle: 9,
                command: code
            }
        );
        assert!(!e.is_fatal());
        assert_eq!(e.errno(), NBD_EINVAL);
        assert_eq!(e.payload_to_discard(), 0);
    }
}

#[test]
fn flags_are_checked_per_command() {
    let ok = [
        (NBD_CMD_READ, NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_DF),
        (NBD_CMD_WRITE, NBD_CMD_FLAG_FUA),
        (NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE),
        (NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FAST_ZERO),
        (NBD_CMD_TRIM, NBD_CMD_FLAG_FUA),
        (NBD_CMD_FLUSH, NBD_CMD_FLAG_FUA),
        (NBD_CMD_DISC, 0),
    ];
    for (cmd, flags) in ok {
        assert!(RequestHeader::parse(&header(flags, cmd, 1, 0, 0), 1 << 20).is_ok());
    }
    let bad = [
        (NBD_CMD_READ, NBD_CMD_FLAG_NO_HOLE),
        (NBD_CMD_WRITE, NBD_CMD_FLAG_DF),
        (NBD_CMD_TRIM, NBD_CMD_FLAG_FAST_ZERO),
        (NBD_CMD_TRIM, NBD_CMD_FLAG_REQ_ONE),
        (NBD_CMD_FLUSH, 1 << 9),
        (NBD_CMD_READ, 0x8000),
    ];
    for (cmd, flags) in bad {
        let e = RequestHeader::parse(&header(flags, cmd, 3, 0, 4096), 1 << 20).unwrap_err();
        assert!(matches!(e, ProtoError::InvalidFlags { handle: 3, .. }), "{e:?}");
        assert!(!e.is_fatal());
        assert_eq!(e.errno(), NBD_EINVAL);
        let expect = if cmd == NBD_CMD_WRITE { 4096 } else { 0 };
        assert_eq!(e.payload_to_discard(), expect);
    }
}

#[test]
fn overflow_is_rejected_and_writes_get_enospc() {
    let e = RequestHeader::parse(&header(0, NBD_CMD_READ, 1, u64::MAX, 1), 1 << 20).unwrap_err();
    assert!(matches!(e, ProtoError::RangeOverflow { .. }));
    assert_eq!(e.errno(), NBD_EINVAL);
    assert!(e.is_read());
    let e = RequestHeader::parse(&header(0, NBD_CMD_WRITE, 1, u64::MAX - 10, 512), 1 << 20).unwrap_err();
    assert_eq!(e.errno(), NBD_ENOSPC);
    assert_eq!(e.payload_to_discard(), 512);
    // Exactly reaching u64::MAX is not an overflow.
    assert!(RequestHeader::parse(&header(0, NBD_CMD_READ, 1, u64::MAX - 1, 1), 1 << 20).is_ok());
    // Commands without a range ignore offset and length.
    assert!(RequestHeader::parse(&header(0, NBD_CMD_FLUSH, 1, u64::MAX, 9), 1 << 20).is_ok());
}

#[test]
fn payload_limit_applies_to_read_and_write_only() {
    let max = 1 << 20;
    let e = RequestHeader::parse(&header(0, NBD_CMD_WRITE, 1, 0, max + 1), max).unwrap_err();
    assert!(!e.is_fatal(), "an oversized write's payload is skipped");
    assert_eq!((e.payload_to_discard(), e.errno()), (max + 1, NBD_EINVAL));
    let e = RequestHeader::parse(&header(0, NBD_CMD_READ, 1, 0, max + 1), max).unwrap_err();
    assert!(!e.is_fatal());
    assert!(e.is_read());
    assert_eq!(e.errno(), NBD_EINVAL);
    assert!(RequestHeader::parse(&header(0, NBD_CMD_READ, 1, 0, max), max).is_ok());
    assert!(RequestHeader::parse(&header(0, NBD_CMD_TRIM, 1, 0, u32::MAX), max).is_ok());
    assert!(RequestHeader::parse(&header(0, NBD_CMD_WRITE_ZEROES, 1, 0, u32::MAX), max).is_ok());
}

#[test]
fn request_round_trips() {
    let r = Request {
        handle: 0xdead_beef,
        command: Command::WriteZeroes,
        flags: CmdFlags(NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE),
        offset: 1 << 40,
        length: 1 << 30,
    };
    assert_eq!(RequestHeader::parse(&r.encode(), 0).unwrap(), r);
    assert!(r.flags.fua() && r.flags.no_hole() && !r.flags.df());
    assert_eq!(r.payload_len(), 0);
}

#[test]
fn simple_reply_layout() {
    let b = encode_simple_reply(0x0102030405060708, NBD_EINVAL);
    assert_eq!(b, [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 22, 1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(
        SimpleReply::parse(&b).unwrap(),
        SimpleReply {
            errno: 22,
            handle: 0x0102030405060708
        }
    );
    let mut bad = b;
    bad[3] = 0;
    assert!(matches!(
        SimpleReply::parse(&bad),
        Err(ProtoError::BadReplyMagic(_))
    ));
}

#[test]
fn structured_chunks() {
    let none = encode_chunk_none(5);
    let h = StructuredHeader::parse(&none).unwrap();
    assert_eq!(
        h,
        StructuredHeader {
            flags: NBD_REPLY_FLAG_DONE,
            chunk_type: NBD_REPLY_TYPE_NONE,
            handle: 5,
            length: 0
        }
    );
    assert!(h.done());

    let d = encode_chunk_offset_data_header(6, 4096, 512, true).unwrap();
    assert_eq!(&d[0..4], &[0x66, 0x8e, 0x33, 0xef]);
    let mut hb = [0u8; 20];
    hb.copy_from_slice(&d[..20]);
    let h = StructuredHeader::parse(&hb).unwrap();
    assert_eq!(
        (h.chunk_type, h.length, h.handle),
        (NBD_REPLY_TYPE_OFFSET_DATA, 520, 6)
    );
    assert_eq!(&d[20..], &4096u64.to_be_bytes());
    assert!(encode_chunk_offset_data_header(6, 0, 0, true).is_none());
    assert!(encode_chunk_offset_data_header(6, 0, u32::MAX - 7, true).is_none());
    assert!(encode_chunk_offset_data_header(6, 0, u32::MAX - 8, true).is_some());

    let e = encode_chunk_error(7, NBD_EIO, "boom", true);
    let mut hb = [0u8; 20];
    hb.copy_from_slice(&e[..20]);
    let h = StructuredHeader::parse(&hb).unwrap();
    assert_eq!((h.chunk_type, h.length, h.flags), (NBD_REPLY_TYPE_ERROR, 10, 1));
    let p = parse_error_chunk(h.chunk_type, &e[20..]).unwrap();
    assert_eq!(
        p,
        ErrorChunk {
            errno: NBD_EIO,
            message: "boom".into(),
            offset: None
        }
    );

    let e = encode_chunk_error_offset(8, NBD_ENOSPC, "", 1 << 33, false);
    hb.copy_from_slice(&e[..20]);
    let h = StructuredHeader::parse(&hb).unwrap();
    assert_eq!(
        (h.chunk_type, h.length, h.flags),
        (NBD_REPLY_TYPE_ERROR_OFFSET, 14, 0)
    );
    let p = parse_error_chunk(h.chunk_type, &e[20..]).unwrap();
    assert_eq!(p.offset, Some(1 << 33));
    assert_eq!(p.errno, NBD_ENOSPC);

    // errno 0 is not a valid error; long messages are clipped.
    let e = encode_chunk_error(1, 0, &"é".repeat(3000), true);
    let p = parse_error_chunk(NBD_REPLY_TYPE_ERROR, &e[20..]).unwrap();
    assert_eq!(p.errno, NBD_EIO);
    assert!(p.message.len() <= MAX_STRING_LEN);
    assert!(parse_error_chunk(NBD_REPLY_TYPE_ERROR, &[0, 0, 0, 5, 0, 9, b'x']).is_err());
    assert!(parse_error_chunk(NBD_REPLY_TYPE_ERROR_OFFSET, &[0, 0, 0, 5, 0, 0]).is_err());
}

#[test]
fn greeting_round_trip_and_oldstyle_refused() {
    let g = encode_greeting(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
    assert_eq!(&g[..8], b"NBDMAGIC");
    assert_eq!(&g[8..16], b"IHAVEOPT");
    assert_eq!(parse_greeting(&g).unwrap(), 3);
    let mut old = g;
    old[8..16].copy_from_slice(&CLISERV_MAGIC.to_be_bytes());
    assert_eq!(parse_greeting(&old), Err(ProtoError::BadGreeting));
}

#[test]
fn options_round_trip() {
    let o = encode_option(NBD_OPT_GO, b"abc");
    let mut h = [0u8; 16];
    h.copy_from_slice(&o[..16]);
    assert_eq!(
        OptionHeader::parse(&h).unwrap(),
        OptionHeader {
            option: NBD_OPT_GO,
            length: 3
        }
    );
    h[0] = b'X';
    assert!(matches!(
        OptionHeader::parse(&h),
        Err(ProtoError::BadOptionMagic(_))
    ));

    let r = encode_option_reply(NBD_OPT_LIST, NBD_REP_ERR_POLICY, b"no");
    let mut h = [0u8; 20];
    h.copy_from_slice(&r[..20]);
    let p = OptionReplyHeader::parse(&h).unwrap();
    assert_eq!(
        (p.option, p.reply_type, p.length),
        (NBD_OPT_LIST, NBD_REP_ERR_POLICY, 2)
    );
    assert!(p.is_error());
    assert_eq!(&r[20..], b"no");
}

#[test]
fn info_request_round_trip_and_validation() {
    let req = InfoRequest {
        name: "disk".into(),
        requests: vec![NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME],
    };
    let enc = req.encode();
    assert_eq!(InfoRequest::parse(&enc).unwrap(), req);
    // Truncated list, overlong name length, trailing bytes, NUL in name.
    assert!(InfoRequest::parse(&enc[..enc.len() - 1]).is_err());
    let mut long = enc.clone();
    long[3] = 200;
    assert!(InfoRequest::parse(&long).is_err());
    let mut trailing = enc.clone();
    trailing.push(0);
    assert!(InfoRequest::parse(&trailing).is_err());
    let nul = InfoRequest {
        name: "a\0b".into(),
        requests: vec![],
    }
    .encode();
    assert_eq!(InfoRequest::parse(&nul), Err(ProtoError::BadString));
    assert!(InfoRequest::parse(&[0, 0, 0, 0, 0]).is_err());
    assert_eq!(
        InfoRequest::parse(&[0, 0, 0, 0, 0, 0]).unwrap(),
        InfoRequest {
            name: String::new(),
            requests: vec![]
        }
    );
}

#[test]
fn info_items_round_trip() {
    for info in [
        Info::Export {
            size: 1 << 30,
            flags: 0x1ff,
        },
        Info::Name("n".into()),
        Info::Description("d e".into()),
        Info::BlockSize {
            minimum: 512,
            preferred: 4096,
            maximum: 32 << 20,
        },
        Info::Unknown(77),
    ] {
        assert_eq!(Info::parse(&info.encode()).unwrap(), info);
    }
    assert_eq!(Info::Export { size: 1, flags: 1 }.encode().len(), 12);
    assert_eq!(
        Info::BlockSize {
            minimum: 1,
            preferred: 1,
            maximum: 1
        }
        .encode()
        .len(),
        14
    );
    assert!(Info::parse(&[0, 0, 1]).is_err());
    assert!(Info::parse(&[0]).is_err());
}

#[test]
fn rep_server_and_export_name_reply() {
    let d = encode_rep_server("vol", Some("a volume"));
    assert_eq!(parse_rep_server(&d).unwrap(), ("vol".into(), "a volume".into()));
    assert!(parse_rep_server(&[0, 0, 0, 9, b'a']).is_err());
    assert_eq!(encode_export_name_reply(5, 1, false).len(), 134);
    let r = encode_export_name_reply(5, 1, true);
    assert_eq!(r, [0, 0, 0, 0, 0, 0, 0, 5, 0, 1]);
}

#[test]
fn names_for_messages() {
    assert_eq!(errno_name(NBD_ENOSPC), "ENOSPC");
    assert_eq!(option_name(NBD_OPT_GO), "NBD_OPT_GO");
    assert_eq!(reply_type_name(NBD_REP_ERR_TOO_BIG), "NBD_REP_ERR_TOO_BIG");
}

mod props {
    use super::super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn request_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 28), max in any::<u32>()) {
            let mut b = [0u8; 28];
            b.copy_from_slice(&bytes);
            let _ = RequestHeader::parse(&b, max);
            // With the right magic as well, to reach the other checks.
            b[0..4].copy_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
            if let Err(e) = RequestHeader::parse(&b, max) {
                let _ = (e.is_fatal(), e.errno(), e.handle(), e.payload_to_discard(), e.to_string());
            }
        }

        #[test]
        fn request_encode_parse_round_trips(
            handle in any::<u64>(),
            cmd in prop::sample::select(vec![Command::Read, Command::Write, Command::Disc, Command::Flush, Command::Trim, Command::WriteZeroes]),
            flag_bits in any::<u16>(),
            offset in any::<u64>(),
            length in any::<u32>(),
        ) {
            let flags = CmdFlags(flag_bits & cmd.allowed_flags());
            let offset = if cmd.has_range() { offset.min(u64::MAX - u64::from(length)) } else { offset };
            let r = Request { handle, command: cmd, flags, offset, length };
            prop_assert_eq!(RequestHeader::parse(&r.encode(), u32::MAX).unwrap(), r);
        }

        #[test]
        fn reply_and_option_parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = InfoRequest::parse(&bytes);
            let _ = Info::parse(&bytes);
            let _ = parse_rep_server(&bytes);
            let _ = parse_error_chunk(NBD_REPLY_TYPE_ERROR, &bytes);
            let _ = parse_error_chunk(NBD_REPLY_TYPE_ERROR_OFFSET, &bytes);
            let _ = parse_string(&bytes);
        }
    }
}
