//! The CLI reads every answer through the wire model (`cairn_api`), but the
//! daemon still serialises a few answers from its own crates' types (the
//! ledger's report, images, the blob store's check, snapshot diffs, the
//! proxy's decision log). Each test here serialises such a type as the
//! daemon does and checks that the wire model reads it back whole: no
//! field missing, renamed or typed differently.

use cairn_api as api;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// `sent` reads as `Wire` and writes back to the same JSON.
fn reads_back_whole<Wire: Serialize + DeserializeOwned>(sent: &impl Serialize) {
    let json = serde_json::to_value(sent).unwrap();
    let read: Wire = serde_json::from_value(json.clone()).unwrap_or_else(|e| panic!("{} does not read {json}: {e}", std::any::type_name::<Wire>()));
    assert_eq!(serde_json::to_value(&read).unwrap(), json, "{} loses or changes a field", std::any::type_name::<Wire>());
}

#[test]
fn the_ledger_report_and_keys() {
    use cairn_ledger::{Envelope, EnvelopeSignature, KeyInfo, ProblemKind, SignedCheckpoint};
    // The runtime builds the wire types itself; what it converts must keep
    // the envelope readable by the ledger crate and each problem's name.
    let envelope = Envelope {
        payload: "e30=".into(),
        payload_type: cairn_ledger::CHECKPOINT_PAYLOAD_TYPE.into(),
        signatures: vec![EnvelopeSignature { keyid: "k1".into(), sig: "c2ln".into() }],
    };
    let checkpoint = cairn_ledger::Checkpoint { task: "t1".into(), seq: 3, head: "ab".repeat(32), time_ms: 9, key_id: "k1".into() };
    let view = cairn_runtime::ledger::checkpoint_view(&SignedCheckpoint { checkpoint, envelope: envelope.clone() });
    assert_eq!(serde_json::from_value::<Envelope>(view.envelope.clone()).unwrap(), envelope);
    reads_back_whole::<api::ledger::CheckpointView>(&view);
    for kind in [ProblemKind::Changed, ProblemKind::Removed, ProblemKind::Reordered, ProblemKind::Rewritten, ProblemKind::BadCheckpoint] {
        let wire = cairn_runtime::ledger::problem_kind(kind);
        assert_eq!(serde_json::to_value(wire).unwrap(), serde_json::json!(kind.as_str()), "{kind:?}");
    }
    let key = KeyInfo { key_id: "k1".into(), public_key: "ef".repeat(32), created_ms: 1, current: true };
    reads_back_whole::<Vec<api::ledger::KeyInfo>>(&vec![key]);
}

#[test]
fn images() {
    use cairn_image::{Committed, Dropped, Image, ImageKind, Projection, RunConfig};
    for kind in [ImageKind::Host, ImageKind::Rootfs, ImageKind::Oci, ImageKind::Template] {
        let oci = kind == ImageKind::Oci;
        let template = kind == ImageKind::Template;
        let image = Image {
            name: "alpine".into(),
            kind,
            rootfs: "/var/lib/cairn/images/alpine/rootfs".into(),
            projections: vec![Projection { host_path: "/usr".into(), at: "/usr".into() }],
            size_bytes: 1 << 23,
            files: 500,
            created_ms: 2,
            source: "/tmp/alpine.tar".into(),
            dropped: Dropped { devices: 1, fifos_sockets: 2, setid: 3 },
            layers: if oci { vec!["sha256:ab".into(), "sha256:cd".into()] } else { Vec::new() },
            config: oci.then(|| RunConfig {
                env: vec!["PATH=/bin".into()],
                working_dir: Some("/src".into()),
                user: Some("1000:1000".into()),
                entrypoint: vec!["/init".into()],
                cmd: vec!["sh".into()],
            }),
            manifest_digest: oci.then(|| "sha256:ef".into()),
            lowers: vec!["/not/on/the/wire".into()],
            parent: template.then(|| "alpine:3".into()),
            committed: if template { vec![Committed { at: "/".into(), layer: "sha256:12".into() }] } else { Vec::new() },
            fork_of: template.then(|| "s2345".into()),
            stack: vec![cairn_image::Layer { lowers: vec!["/not/either".into()], at: "/".into(), history: 1 }],
            trust: Some("/not/stored".into()),
        };
        reads_back_whole::<api::images::Image>(&image);
        let layer_details = if oci {
            vec![cairn_image::LayerInfo {
                diff_id: "sha256:ab".into(),
                blob_digest: "sha256:99".into(),
                media_type: "application/vnd.oci.image.layer.v1.tar+gzip".into(),
                bytes: 10,
                size_bytes: 20,
                files: 3,
                created_ms: 4,
                dropped: Dropped { devices: 1, fifos_sockets: 0, setid: 2 },
                skipped: 1,
            }]
        } else {
            Vec::new()
        };
        reads_back_whole::<api::images::ImageDetail>(&cairn_runtime::ImageDetail { image, layer_details });
    }
}

#[test]
fn the_blob_stores_check_and_a_snapshot_diff() {
    let check = cairn_blob::CheckReport {
        packs: 2,
        chunks: 40,
        manifests: 3,
        bytes_read: 1 << 20,
        chunks_verified: 40,
        problems: vec!["manifest 12ab: missing".into()],
    };
    reads_back_whole::<api::snapshots::CheckReport>(&check);
    let diff = cairn_snapshot::Diff { added: vec!["/workspace/a".into()], changed: vec!["/etc/b".into()], deleted: vec!["/c".into()] };
    reads_back_whole::<api::snapshots::Diff>(&diff);
}

/// The reports gc and rollback answer are built as the wire model's
/// types; these are the blob store's and the restore's own, which those
/// answers copy field by field.
#[test]
fn what_gc_and_rollback_copy() {
    let gc = cairn_blob::GcReport {
        packs_deleted: 1,
        manifests_deleted: 2,
        index_files_rewritten: 3,
        bytes_freed: 4,
        kept_young: 5,
        packs_partly_live: 6,
        dry_run: true,
    };
    reads_back_whole::<api::snapshots::GcReport>(&gc);
    let restore = cairn_snapshot::RestoreStats { files_written: 1, bytes_written: 2, files_kept: 3, entries_removed: 4, duration_ms: 5.5 };
    reads_back_whole::<api::snapshots::RestoreStats>(&restore);
}

#[test]
fn egress_decisions() {
    use cairn_egress::{Attempt, AttemptKind};
    for (kind, open, address) in [(AttemptKind::Connect, true, Some("93.184.215.14:443".parse().unwrap())), (AttemptKind::Http, false, None)] {
        let attempt = Attempt {
            kind,
            host: "docs.example.com".into(),
            port: 443,
            address,
            allowed: open,
            rule: open.then(|| "docs.example.com".to_owned()),
            reason: "why".into(),
            status: open.then_some(200),
            bytes_up: 1,
            bytes_down: 2,
            duration_ms: 3,
            open,
            method: (!open).then(|| "GET".to_owned()),
            path: (!open).then(|| "/repos/acme/".to_owned()),
            secrets: if open { Vec::new() } else { vec!["TOKEN".to_owned()] },
            scrubbed: u64::from(!open),
        };
        reads_back_whole::<api::egress::Attempt>(&attempt);
    }
}
