use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::answer::Target;
use super::poll::instance_matchers;
use super::query::Query;
use super::reading::{GpuData, HostData, Ident, Identities, snapshot};
use super::table::{Names, fold_details, quick_table, summary_table, table};
use super::*;
use crate::Deaf;
use gpusweep_core::model::{Feature, FindingKind, GpuState, MIB};

fn server(url: &str, selector: &str) -> PromServer {
    PromServer {
        url: gpusweep_core::host::HttpUrl::parse(url).expect("url"),
        selector: gpusweep_core::host::parse_selector(selector).expect("selector"),
    }
}

fn gpu(used: f64, clean: Option<f64>, unexplained: &[(&str, f64)]) -> GpuData {
    GpuData {
        used: Some(used),
        clean,
        unexplained: unexplained
            .iter()
            .map(|(k, b)| ((*k).to_string(), *b))
            .collect(),
        ..Default::default()
    }
}

#[test]
fn a_serve_host_keeps_its_verdicts_and_a_dcgm_host_names_its_blind_spot() {
    let mut d = HostData {
        gpusweep: true,
        taken_s: Some(1_700_000_000.5),
        ..Default::default()
    };
    d.gpus.insert(0, gpu(0.0, Some(1.0), &[]));
    d.gpus.insert(1, gpu(500.0, Some(0.0), &[]));
    d.gpus.insert(
        2,
        gpu(
            10240.0,
            Some(0.0),
            &[("ghost", 10.0 * 1024.0 * 1024.0 * 1024.0)],
        ),
    );
    d.gpus.insert(
        3,
        GpuData {
            unreadable: true,
            ..Default::default()
        },
    );
    d.counts.push(("ghost".into(), "leak".into(), 1.0));
    d.counts.push(("zombie".into(), "warning".into(), 2.0));
    let mut ids = Identities::default();
    ids.gpus.insert(
        ("node1".into(), 0),
        Ident {
            usable_mib: Some(1000.0),
            reserved_mib: Some(24.0),
            ..Default::default()
        },
    );
    // Without its seal, the serve's series are labels: nothing judged, the proof a named blind spot.
    let s = snapshot("node1", &d, (&ids, None), &HashMap::new(), 5);
    assert!(s.gpus.iter().all(|g| g.judged.is_none()), "{s:?}");
    assert!(s.missing_features.contains(&Feature::Proof));
    assert_eq!(s.live_url.as_deref(), Some("ssh://node1"));
    let proven = summary_of_states(
        "node1",
        1_700_000_000_500,
        &[
            (GpuState::Clean, 0b0001),
            (GpuState::InUse, 0b0010),
            (GpuState::Leak, 0b0100),
            (GpuState::Error, 0b1000),
        ],
        &[("ghost", "leak", 1), ("zombie", "warning", 2)],
    );
    let s = snapshot("node1", &d, (&ids, Some(&proven)), &HashMap::new(), 5);
    assert!(!s.missing_features.contains(&Feature::Proof));
    let states: Vec<Option<GpuState>> = s.gpus.iter().map(|g| g.judged).collect();
    assert_eq!(
        states,
        [
            Some(GpuState::Clean),
            Some(GpuState::InUse),
            Some(GpuState::Leak),
            Some(GpuState::Error)
        ]
    );
    assert_eq!(s.taken_at_ms, 1_700_000_000_500);
    assert_eq!(s.gpus[0].memory.total, Some(1024 * MIB));
    assert_eq!(s.gpus[3].memory.used, None, "no reading is not 0");
    // The ghost comes once, per GPU with its bytes; the zombies as a count.
    assert_eq!(
        s.findings
            .iter()
            .filter(|f| f.kind == FindingKind::Ghost)
            .count(),
        1
    );
    assert_eq!(s.findings[0].gpu, Some(2));
    assert!(
        s.findings
            .iter()
            .any(|f| f.kind == FindingKind::Zombie && f.detail.starts_with("2 zombie"))
    );
    assert!(s.missing_features.contains(&Feature::Actions));
    assert!(!s.missing_features.contains(&Feature::ProcessList));
    assert_eq!(s.live_url.as_deref(), Some("ssh://node1"));
}

#[test]
fn a_dcgm_host_names_its_blind_spots() {
    let ids = Identities::default();
    let mut dcgm = HostData::default();
    dcgm.gpus.insert(0, gpu(0.0, None, &[]));
    dcgm.gpus.insert(1, gpu(700.0, None, &[]));
    let s = snapshot("node2", &dcgm, (&ids, None), &HashMap::new(), 7);
    assert!(s.gpus.iter().all(|g| g.judged.is_none()));
    assert!(s.missing_features.contains(&Feature::Proof));
    assert_eq!(s.taken_at_ms, 7);
    assert!(s.missing_features.contains(&Feature::ProcessList));
    assert!(
        s.findings.is_empty(),
        "no leak is claimed without a process list"
    );
    assert_eq!(s.gpus[1].memory.used, Some(700 * MIB));
}

#[test]
fn two_targets_naming_one_host_are_a_conflict() {
    let one: BTreeSet<Target> = [Target {
        job: "gpusweep".into(),
        instance: "10.0.0.2:9401".into(),
    }]
    .into();
    assert_eq!(conflict("gpu-b", &one), None);
    let mut two = one.clone();
    two.insert(Target {
        job: "other".into(),
        instance: "10.0.0.66:9400".into(),
    });
    let why = conflict("gpu-b", &two).expect("a conflict");
    assert!(
        why.contains("10.0.0.2:9401") && why.contains("10.0.0.66:9400") && why.contains("job="),
        "{why}"
    );
}

#[test]
fn samples_borrow_their_labels_and_still_read_escaped_ones() {
    let p = server("http://p:9090", "");
    let body = br#"{"status":"success","data":{"resultType":"vector","result":[
        {"metric":{"Hostname":"gpu-b0001","gpu":"3","job":"x"},"value":[1733338338.123,"512"]},
        {"metric":{"Hostname":"odd\"host","gpu":"0"},"value":[1733338338.5,"NaN"]}]}}"#;
    let s = p.samples(body).expect("an answer");
    assert!(matches!(
        s[0].metric.hostname.as_ref().map(|t| &t.0),
        Some(Cow::Borrowed("gpu-b0001"))
    ));
    assert!(matches!(s[0].value.1.0, Cow::Borrowed("512")));
    assert_eq!(
        (s[0].host(), s[0].gpu(), s[0].value()),
        (Some("gpu-b0001"), Some(3), Some(512.0))
    );
    assert_eq!(s[1].host(), Some("odd\"host"));
    assert!(s[1].value().is_some_and(f64::is_nan));
    let failed = br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
    assert!(p.samples(failed).is_err_and(|e| e.contains("parse error")));
}

#[test]
fn a_host_polled_again_is_the_same_but_for_its_time() {
    let mut a = HostData {
        taken_s: Some(10.0),
        ..Default::default()
    };
    a.gpus.insert(0, gpu(5.0, Some(0.0), &[("ghost", 1.0)]));
    let mut b = a.clone();
    b.taken_s = Some(15.0);
    assert!(a.same_but_time(&b));
    assert_eq!(b.taken_at_ms(1), 15_000);
    b.gpus.insert(1, gpu(0.0, Some(1.0), &[]));
    assert!(!a.same_but_time(&b), "a GPU more");
    let mut c = a.clone();
    c.gpus
        .insert(0, gpu(5.0, Some(0.0), &[("ghost", f64::NAN)]));
    assert!(
        !c.same_but_time(&c.clone()),
        "an unknown size is never taken as unchanged"
    );
    assert_eq!(
        HostData::default().taken_at_ms(7),
        7,
        "no serve time: when it was polled"
    );
}

#[test]
fn names_keep_the_first_place_of_a_name() {
    let host = |n: &str| PromHost {
        name: n.into(),
        sink: Arc::new(Deaf),
        detached: Arc::default(),
    };
    let hosts = [host("a"), host("b"), host("a")];
    let names = Names::new(&hosts);
    assert_eq!(
        (names.of("a"), names.of("b"), names.of("c")),
        (Some(0), Some(1), None)
    );
    assert_eq!(names.len(), 2);
}

/// An answer of Prometheus's API holding these samples (JSON objects, comma separated).
fn answer(result: &str) -> bytes::Bytes {
    format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{result}]}}}}"#)
        .into_bytes()
        .into()
}

/// One sample of host `host` at its own target, with more labels (`extra`, starting with a comma).
fn sample(host: &str, extra: &str, value: &str) -> String {
    format!(
        r#"{{"metric":{{"Hostname":"{host}","job":"gpusweep","instance":"{host}:9401"{extra}}},"value":[1,"{value}"]}}"#
    )
}

fn fleet(names: &[&str]) -> Vec<PromHost> {
    names
        .iter()
        .map(|n| PromHost {
            name: (*n).into(),
            sink: Arc::new(Deaf),
            detached: Arc::default(),
        })
        .collect()
}

/// A summary says all of a host whose serve read every GPU and found nothing (the same data a whole read
/// builds) and of a host of dcgm-exporter alone; it leaves to read the details of a host with findings, of
/// one whose serve could not read a GPU, and of a serve that sends no count of findings.
#[test]
fn a_summary_is_the_whole_reading_of_a_quiet_host_and_leaves_the_others_details() {
    let p = server("http://p:9090", "");
    let hosts = fleet(&["quiet", "loud", "blind", "old", "dcgm"]);
    let names = Names::new(&hosts);
    let g = |n: u32| format!(r#","gpu":"{n}""#);
    let serves = ["quiet", "loud", "blind", "old"];
    let used = answer(
        &["quiet", "loud", "blind", "old", "dcgm"]
            .iter()
            .flat_map(|h| [sample(h, &g(0), "0"), sample(h, &g(1), "500")])
            .collect::<Vec<_>>()
            .join(","),
    );
    let clean = answer(
        &serves
            .iter()
            .flat_map(|h| [sample(h, &g(0), "1"), sample(h, &g(1), "0")])
            .collect::<Vec<_>>()
            .join(","),
    );
    let unreadable = answer(&sample("blind", "", "0"));
    let counts = answer(
        &[("quiet", "0"), ("loud", "3"), ("blind", "0")]
            .map(|(h, n)| sample(h, "", n))
            .join(","),
    );
    let taken = answer(
        &["quiet", "loud", "blind", "old", "dcgm"]
            .map(|h| sample(h, "", "1700000000"))
            .join(","),
    );
    let up = answer(
        &["quiet", "loud", "blind", "old", "dcgm"]
            .map(|h| {
                format!(
                    r#"{{"metric":{{"job":"gpusweep","instance":"{h}:9401"}},"value":[1,"1"]}}"#
                )
            })
            .join(","),
    );
    let ((mut sums, _), details) = summary_table(
        &p,
        &names,
        &[
            used.clone(),
            clean.clone(),
            unreadable.clone(),
            counts,
            taken.clone(),
            up.clone(),
        ],
    )
    .expect("a summary");
    assert_eq!(details, [false, true, true, true, false]);
    let findings = answer(&sample(
        "loud",
        r#","kind":"zombie","severity":"warning""#,
        "3",
    ));
    let unexplained = answer(&sample("old", r#","gpu":"1","kind":"residual""#, "1024"));
    let whole_answers = [
        used,
        clean,
        unreadable.clone(),
        unexplained.clone(),
        findings.clone(),
        taken,
        up,
    ];
    let (whole, _) = table(&p, &names, &whole_answers).expect("a whole read");
    for name in ["quiet", "dcgm"] {
        let at = names.of(name).expect("named");
        assert!(sums[at].is_some(), "{name}");
        assert_eq!(sums[at], whole[at], "{name}'s summary and whole read");
    }
    assert_ne!(sums[1], whole[1], "loud's summary lacks its findings");
    // The details folded into the summary: what the whole read says of every host.
    fold_details(&p, &names, &mut sums, &[unreadable, unexplained, findings]).expect("details");
    assert_eq!(sums, whole);
}

#[test]
fn a_serve_that_says_it_cannot_read_its_gpus_has_no_clean_gpu() {
    let p = server("http://p:9090", "");
    let t = r#""Hostname":"node1","job":"gpusweep","instance":"10.0.0.1:9401""#;
    let answers = [
        answer(&format!(
            r#"{{"metric":{{{t},"gpu":"0"}},"value":[1,"0"]}}"#
        )),
        answer(&format!(
            r#"{{"metric":{{{t},"gpu":"0"}},"value":[1,"1"]}}"#
        )),
        // gpusweep_gpus_readable 0: no `gpu` label.
        answer(&format!(r#"{{"metric":{{{t}}},"value":[1,"0"]}}"#)),
        answer(""),
        answer(""),
        answer(""),
        answer(""),
    ];
    let hosts = fleet(&["node1"]);
    let (table, _) = table(&p, &Names::new(&hosts), &answers).expect("a table");
    let d = table[0].as_ref().expect("node1's data");
    assert!(d.gpus_unreadable);
    let mut proven = summary_of_states("node1", 5, &[(GpuState::Clean, 1)], &[]);
    proven.readable = Some(false);
    let s = snapshot(
        "node1",
        d,
        (&Identities::default(), Some(&proven)),
        &Up::new(),
        5,
    );
    assert_eq!(s.gpus[0].judged, Some(GpuState::Unknown), "{s:?}");
    assert!(
        s.gpu_error
            .as_deref()
            .is_some_and(|e| e.contains("gpus_readable")),
        "{s:?}"
    );
}

#[test]
fn another_target_cannot_mark_a_host_demo_nor_move_its_api() {
    let p = server("http://p:9090", "");
    let body = br#"{"status":"success","data":{"resultType":"vector","result":[
        {"metric":{"Hostname":"gpu-b","instance":"10.0.0.2:9401","scheme":"http","api_path":""},"value":[1,"1"]},
        {"metric":{"Hostname":"gpu-b","instance":"10.0.0.66:9400","scheme":"https","api_path":"/hosts/x","simulated":"true"},"value":[1,"1"]}]}}"#;
    let mut ids = Identities::default();
    ids.serves_from(&p.samples(body).expect("an answer"));
    let mut d = HostData {
        gpusweep: true,
        ..Default::default()
    };
    d.targets.insert(Target {
        job: "gpusweep".into(),
        instance: "10.0.0.2:9401".into(),
    });
    let own = Target {
        job: "gpusweep".into(),
        instance: "10.0.0.2:9401".into(),
    };
    let up: Up = [(own, 1.0)].into();
    // Its serve's address only where its summary is proven: the token goes nowhere else.
    let s = snapshot("gpu-b", &d, (&ids, None), &up, 5);
    assert_eq!(s.live_url.as_deref(), Some("ssh://gpu-b"));
    let proven = summary_of_states("gpu-b", 5, &[], &[]);
    let s = snapshot("gpu-b", &d, (&ids, Some(&proven)), &up, 5);
    assert!(!s.simulated, "marked DEMO by another target");
    assert_eq!(s.live_url.as_deref(), Some("http://10.0.0.2:9401"));
}

#[test]
fn any_instance_is_asked_for_escaped_and_one_that_cannot_be_is_counted() {
    let (m, skipped) = instance_matchers(
        [
            "10.0.0.2:9401",
            "gpu-b/serve",
            r#"x"y\z"#,
            "bad\nname",
            "(a)+",
        ]
        .into_iter(),
        100,
    );
    assert_eq!(skipped, 1, "a control character cannot be asked for");
    assert_eq!(
        m,
        [r#"instance=~"10\\.0\\.0\\.2:9401|gpu-b/serve|x\"y\\\\z|\\(a\\)\\+""#]
    );
    let (m, skipped) = instance_matchers(["a", "b", "c"].into_iter(), 2);
    assert_eq!(
        (m.len(), skipped),
        (1, 1),
        "past the limit: counted, not asked"
    );
}

#[test]
fn a_host_is_read_only_from_its_one_own_target_scraped_and_up() {
    let t = |job: &str, inst: &str| Target {
        job: job.into(),
        instance: inst.into(),
    };
    let (own, fake) = (t("gpusweep", "10.0.0.2:9401"), t("other", "10.0.0.66:9400"));
    let data = |targets: &[&Target]| HostData {
        targets: targets.iter().map(|x| (*x).clone()).collect(),
        ..Default::default()
    };
    let voices = |v: &[&Target]| v.iter().map(|x| (*x).clone()).collect::<BTreeSet<_>>();
    let up = |v: &[(&Target, f64)]| v.iter().map(|(x, u)| ((*x).clone(), *u)).collect::<Up>();
    // Its own target alone, up: read.
    let d = data(&[&own]);
    assert_eq!(
        judge_voices("gpu-b", &voices(&[&own]), Some(&d), &up(&[(&own, 1.0)])),
        None
    );
    // Its own target down, an impostor answering: a conflict naming both.
    let d = data(&[&fake]);
    let why = judge_voices(
        "gpu-b",
        &voices(&[&own, &fake]),
        Some(&d),
        &up(&[(&own, 0.0), (&fake, 1.0)]),
    )
    .expect("never the impostor's word");
    assert!(
        why.contains("10.0.0.2:9401") && why.contains("10.0.0.66:9400"),
        "{why}"
    );
    // Its own target gone from Prometheus's scraping (a restarted pod's old address): no voice any more.
    assert_eq!(
        judge_voices(
            "gpu-b",
            &voices(&[&own, &fake]),
            Some(&d),
            &up(&[(&fake, 1.0)])
        ),
        None
    );
    // Series naming a target Prometheus does not scrape (relabelled with honor_labels): no one's word.
    let d = data(&[&own]);
    let why = judge_voices("gpu-b", &voices(&[&own]), Some(&d), &up(&[])).expect("a forged target");
    assert!(why.contains("does not scrape"), "{why}");
    // Its own target alone and down.
    let why = judge_voices("gpu-b", &voices(&[&own]), None, &up(&[(&own, 0.0)])).expect("down");
    assert!(why.contains("up == 0"), "{why}");
}

#[test]
fn a_narrowed_read_names_plain_hosts_escaped_and_nothing_else() {
    assert_eq!(
        only_hosts([Some("gpu-b2"), Some("node1.dc"), Some("gpu-b2")].into_iter()).as_deref(),
        Some(r#"Hostname=~"gpu-b2|node1\\.dc""#)
    );
    // A name a target chose that is not a plain host name, one not named by Hostname: read them all.
    assert_eq!(
        only_hosts([Some("a\"}) or vector(1"), Some("b")].into_iter()),
        None
    );
    assert_eq!(only_hosts([Some("a|b")].into_iter()), None);
    assert_eq!(only_hosts([Some("a"), None].into_iter()), None);
    let many: Vec<String> = (0..100).map(|k| format!("h{k:0>200}")).collect();
    assert_eq!(only_hosts(many.iter().map(|s| Some(s.as_str()))), None);
    let p = server("http://prom:9090", r#"job="gpu""#);
    let q = Queries::new(&p, Some(r#"Hostname=~"a""#));
    assert!(
        q.used
            .contains(r#"DCGM_FI_DEV_FB_USED{job="gpu",Hostname=~"a"}"#),
        "{}",
        q.used
    );
}

#[test]
fn queries_carry_the_selector() {
    let p = server("http://p:9090", r#"job="gpu""#);
    let q = Queries::new(&p, None);
    assert_eq!(
        q.used,
        r#"sum by (Hostname, hostname, job, instance, gpu) (max by (Hostname, hostname, job, instance, gpu, GPU_I_ID) (DCGM_FI_DEV_FB_USED{job="gpu"} or DCGM_FI_DEV_FB_USED_BYTES{job="gpu"} / 1048576))"#
    );
    assert!(q.up.starts_with("max by (job, instance) (up and on (job, instance)"));
    assert!(
        q.up.contains(r#"DCGM_FI_DEV_FB_USED{job="gpu",gpu="0"}[10m]"#)
            && q.up
                .contains(r#"DCGM_FI_DEV_FB_USED_BYTES{job="gpu",gpu="0"}[10m]"#),
        "{}",
        q.up
    );
    let p = server("http://p:9090", "");
    assert!(
        Queries::new(&p, None)
            .clean
            .contains("gpusweep_gpu_clean{}")
    );
}

#[test]
fn identities_read_again_keep_known_sizes_and_name_the_hosts_that_changed() {
    let ident = |uuid: &str, usable: Option<f64>| Ident {
        uuid: Some(uuid.to_string()),
        usable_mib: usable,
        reserved_mib: usable.map(|_| 500.0),
        sized: usable.is_some(),
        ..Default::default()
    };
    let mut known = Identities::default();
    known
        .gpus
        .insert(("n1".into(), 0), ident("GPU-a", Some(1000.0)));
    known
        .gpus
        .insert(("n1".into(), 1), ident("GPU-b", Some(1000.0)));
    known
        .gpus
        .insert(("n2".into(), 0), ident("GPU-c", Some(2000.0)));
    known.serve.insert(
        ("n4".into(), "n4:9401".into()),
        ("http".into(), String::new()),
    );
    // Read again: n1's GPU 1 swapped, n2 as it was, n3 new, n4's serve now says https; no sizes read yet.
    let mut again = Identities::default();
    for (host, gpu, uuid) in [
        ("n1", 0, "GPU-a"),
        ("n1", 1, "GPU-b2"),
        ("n2", 0, "GPU-c"),
        ("n3", 0, "GPU-d"),
    ] {
        again.gpus.insert((host.into(), gpu), ident(uuid, None));
    }
    again.serve.insert(
        ("n4".into(), "n4:9401".into()),
        ("https".into(), String::new()),
    );
    let to_size = again.keep_sizes(&known);
    assert_eq!(
        to_size,
        ["n1", "n3"].map(String::from).into(),
        "a new or swapped GPU is sized"
    );
    let a0 = &again.gpus[&("n1".to_string(), 0)];
    assert_eq!(
        (a0.usable_mib, a0.reserved_mib, a0.sized),
        (Some(1000.0), Some(500.0), true)
    );
    assert_eq!(again.gpus[&("n1".to_string(), 1)].usable_mib, None);
    // Asked for n1's and n3's sizes; n3's reservation is not in Prometheus: unknown, and not asked again.
    again
        .gpus
        .get_mut(&("n1".to_string(), 1))
        .expect("n1 1")
        .usable_mib = Some(1000.0);
    again.sized(Some(&to_size));
    assert!(again.gpus.values().all(|g| g.sized));
    let mut changed: Vec<&str> = known.changed_hosts(&again).into_iter().collect();
    changed.sort_unstable();
    assert_eq!(changed, ["n1", "n3", "n4"], "n2 is read again for nothing");
    // A third read finds everything as it was: nothing to size, nothing changed.
    let mut third = Identities::default();
    for (key, id) in &again.gpus {
        third.gpus.insert(
            key.clone(),
            Ident {
                usable_mib: None,
                reserved_mib: None,
                sized: false,
                ..id.clone()
            },
        );
    }
    third.serve = again.serve.clone();
    assert!(third.keep_sizes(&again).is_empty());
    assert!(again.changed_hosts(&third).is_empty());
    // A second voice for a host is a change.
    third.voices.entry("n2".into()).or_default().insert(Target {
        job: "other".into(),
        instance: "10.0.0.9:9401".into(),
    });
    assert_eq!(
        again.changed_hosts(&third).into_iter().collect::<Vec<_>>(),
        ["n2"]
    );
}

/// The identities a read of these digests learns: (host, its target's instance, the digest's value).
fn digests_said(rows: &[(&str, &str, &str)]) -> Identities {
    let p = server("http://prom:9090", "");
    let body = answer(
        &rows
            .iter()
            .map(|(host, instance, d)| {
                format!(
                    r#"{{"metric":{{"Hostname":"{host}","job":"gpusweep","instance":"{instance}"}},"value":[1,"{d}"]}}"#
                )
            })
            .collect::<Vec<_>>()
            .join(","),
    );
    let mut ids = Identities::default();
    ids.digests_from(&p.samples(&body).expect("samples"));
    ids
}

/// Each host with one sized GPU, its own target its voice and serve, a demo.
fn known_as_their_own(known: &mut Identities, hosts: &[&str]) {
    for host in hosts {
        known.gpus.insert(
            ((*host).into(), 0),
            Ident {
                uuid: Some(format!("GPU-{host}")),
                usable_mib: Some(1000.0),
                sized: true,
                ..Default::default()
            },
        );
        known
            .voices
            .entry((*host).into())
            .or_default()
            .insert(Target {
                job: "gpusweep".into(),
                instance: format!("{host}:9401"),
            });
        known.serve.insert(
            ((*host).into(), format!("{host}:9401")),
            ("http".into(), String::new()),
        );
        known
            .simulated
            .insert(((*host).into(), format!("{host}:9401")));
    }
}

/// Identities read again are asked only of hosts whose identity digest moved: a host keeps what it had where
/// its one digest is the one it had, from the same target; it is asked again where the digest moved, is gone,
/// is new, comes from another target or from two, or where it never had one (dcgm-exporter's). What is kept
/// is its GPUs (with their sizes), serve, demo mark and voices, and nothing of a host asked again.
#[test]
fn identities_are_asked_again_only_of_hosts_whose_digest_moved() {
    let mut known = digests_said(&[
        ("same", "same:9401", "7"),
        ("moved", "moved:9401", "7"),
        ("gone", "gone:9401", "7"),
        ("rehomed", "rehomed:9401", "7"),
        ("twice", "twice:9401", "7"),
    ]);
    known_as_their_own(
        &mut known,
        &["same", "moved", "gone", "rehomed", "twice", "dcgm"],
    );
    let now = digests_said(&[
        ("same", "same:9401", "7"),
        ("moved", "moved:9401", "8"),
        ("rehomed", "elsewhere:9401", "7"),
        ("twice", "twice:9401", "7"),
        ("twice", "impostor:9401", "7"),
        ("new", "new:9401", "1"),
        ("odd", "odd:9401", "NaN"),
    ]);
    let again = known.to_ask_again(&now.digests);
    assert_eq!(
        again,
        ["dcgm", "gone", "moved", "new", "rehomed", "twice"]
            .map(String::from)
            .into(),
        "only the host whose one digest held is not asked again"
    );
    assert!(now.by_hostname.contains("same") && !now.by_hostname.contains("odd"));
    assert_eq!(
        now.voices["twice"].len(),
        2,
        "a target that sends a host's digest is its voice"
    );
    let mut next = now;
    next.keep_unasked(&known, &again);
    let hosts_of = |ids: &Identities| {
        let mut h: Vec<String> = ids.gpus.keys().map(|(h, _)| h.clone()).collect();
        h.extend(ids.serve.keys().map(|(h, _)| h.clone()));
        h.extend(ids.simulated.iter().map(|(h, _)| h.clone()));
        h.sort();
        h.dedup();
        h
    };
    assert_eq!(
        hosts_of(&next),
        ["same"],
        "nothing of a host asked again is kept"
    );
    assert_eq!(
        next.voices["rehomed"]
            .iter()
            .map(|t| t.instance.as_str())
            .collect::<Vec<_>>(),
        ["elsewhere:9401"],
        "its voices are what is heard now"
    );
    assert_eq!(
        next.gpus[&("same".to_string(), 0)],
        known.gpus[&("same".to_string(), 0)],
        "its GPU kept with its size"
    );
    assert!(next.keep_sizes(&known).is_empty(), "nothing to size");
    assert!(
        known.changed_hosts(&next).iter().all(|h| *h != "same"),
        "the kept host is not read again"
    );
}

/// A compact summary is a host's first view only where it is whole: its clean bytes came, and every state
/// and mask is one this client reads. A clean GPU reads 0 only where the summary says the clean GPUs' bytes
/// are 0; otherwise it is unknown (a "clean" held to its bytes), as are every other GPU's bytes.
#[test]
fn a_summary_is_a_first_view_only_where_it_is_whole_and_a_clean_is_held_to_its_bytes() {
    let p = server("http://p:9090", "");
    let hosts = fleet(&["calm", "busy", "newer", "wide", "old", "heavy"]);
    let names = Names::new(&hosts);
    let st = |s: &str| format!(r#","state":"{s}""#);
    let clean_used = answer(
        &[
            ("calm", "0"),
            ("busy", "0"),
            ("newer", "0"),
            ("wide", "0"),
            ("heavy", "1048576"),
        ]
        .map(|(h, v)| sample(h, "", v))
        .join(","),
    );
    let states = answer(
        &[
            sample("calm", &st("clean"), "3"),
            sample("busy", &st("clean"), "1"),
            sample("busy", &st("leak"), "2"),
            sample("busy", &st("in_use"), "4"),
            // A state this client does not know, and a mask past what a float holds exactly.
            sample("newer", &st("clean"), "1"),
            sample("newer", &st("sleeping"), "2"),
            sample("wide", &st("clean"), "9007199254740992"),
            // No clean bytes: a serve whose summary is not whole.
            sample("old", &st("clean"), "1"),
            sample("heavy", &st("clean"), "1"),
        ]
        .join(","),
    );
    let kinds = answer(&sample("busy", r#","kind":"ghost","severity":"leak""#, "1"));
    let none = answer("");
    let up = answer(
        &["calm", "busy", "newer", "wide", "old", "heavy"]
            .map(|h| {
                format!(
                    r#"{{"metric":{{"job":"gpusweep","instance":"{h}:9401"}},"value":[1,"1"]}}"#
                )
            })
            .join(","),
    );
    let (data, _) = quick_table(&p, &names, &[clean_used, states, kinds, none, up]).expect("table");
    let at = |h: &str| data[names.of(h).expect("name")].as_ref().expect("data");
    let calm = at("calm");
    assert!(calm.quick, "{calm:?}");
    assert_eq!(calm.gpus.len(), 2, "{calm:?}");
    assert!(
        calm.gpus
            .values()
            .all(|g| g.used == Some(0.0) && g.clean == Some(1.0))
    );
    let busy = at("busy");
    assert!(busy.quick, "{busy:?}");
    let state = |d: &HostData, i: u32| d.gpus[&i].state;
    assert_eq!(
        (state(busy, 0), state(busy, 1), state(busy, 2)),
        (
            Some(GpuState::Clean),
            Some(GpuState::Leak),
            Some(GpuState::InUse)
        )
    );
    assert_eq!((busy.gpus[&1].used, busy.gpus[&2].used), (None, None));
    assert_eq!(busy.counts, vec![("ghost".into(), "leak".into(), 1.0)]);
    for h in ["newer", "wide", "old"] {
        assert!(!at(h).quick, "{h}: {:?}", at(h));
    }
    let heavy = at("heavy");
    assert!(heavy.quick && heavy.gpus[&0].used.is_none(), "{heavy:?}");
    // In the snapshot: the serve's word (judged clean) without bytes to hold it to (the runtime then says
    // unknown: `a_first_view_comes_from_each_hosts_summary_and_the_whole_reading_follows`).
    let proven = summary_of_states("heavy", 0, &[(GpuState::Clean, 1)], &[]);
    let snap = snapshot(
        "heavy",
        heavy,
        (&Identities::default(), Some(&proven)),
        &HashMap::new(),
        0,
    );
    assert_eq!(snap.gpus[0].judged, Some(GpuState::Clean));
    assert_eq!(snap.gpus[0].memory.used, None);
    assert!(snap.missing_features.contains(&Feature::GpuDetail));
}

/// A proven summary of these states (masks) and findings (kind, severity, count).
fn summary_of_states(
    host: &str,
    taken_ms: u64,
    states: &[(GpuState, u64)],
    kinds: &[(&str, &str, u64)],
) -> gpusweep_core::seal::HostSummary {
    gpusweep_core::seal::HostSummary {
        host: host.into(),
        taken_ms,
        readable: Some(true),
        states: states.iter().copied().collect(),
        clean_used: Some(0),
        kinds: kinds
            .iter()
            .map(|(k, s, n)| (((*k).to_string(), (*s).to_string()), *n))
            .collect(),
        simulated: false,
    }
}

/// A host's summary and seal as its serve exports them, each series at its own target; `scraped_s` the
/// scrape's time. `tamper` changes the page before it is answered.
fn sealed_answer(
    key: &gpusweep_core::seal::SealKey,
    s: &gpusweep_core::seal::HostSummary,
    scraped_s: f64,
    tamper: impl Fn(&mut Vec<String>),
) -> bytes::Bytes {
    let t = format!(
        r#""Hostname":"{h}","job":"gpusweep","instance":"{h}:9401""#,
        h = s.host
    );
    let one = |name: &str, extra: &str, v: u64| {
        format!(r#"{{"metric":{{"__name__":"{name}",{t}{extra}}},"value":[{scraped_s},"{v}"]}}"#)
    };
    let [mac_0, mac_1] = s.seal(key);
    let mut out = vec![
        one("gpusweep_host_seal", r#","part":"taken_ms""#, s.taken_ms),
        one("gpusweep_host_seal", r#","part":"mac_0""#, mac_0),
        one("gpusweep_host_seal", r#","part":"mac_1""#, mac_1),
        one(
            "gpusweep_gpus_readable",
            "",
            u64::from(s.readable == Some(true)),
        ),
    ];
    for (st, mask) in &s.states {
        out.push(one(
            "gpusweep_host_gpu_states",
            &format!(r#","state":"{}""#, st.as_str()),
            *mask,
        ));
    }
    if let Some(u) = s.clean_used {
        out.push(one("gpusweep_host_clean_memory_used_bytes", "", u));
    }
    for ((k, sev), n) in &s.kinds {
        out.push(one(
            "gpusweep_host_finding_kinds",
            &format!(r#","kind":"{k}","severity":"{sev}""#),
            *n,
        ));
    }
    tamper(&mut out);
    answer(&out.join(","))
}

#[test]
fn a_summary_is_believed_only_where_its_seal_checks() {
    use super::proof::{Proof, proofs};
    let p = server("http://p:9090", "");
    let key = gpusweep_core::seal::SealKey::new(&[3; 32]).expect("key");
    let other = gpusweep_core::seal::SealKey::new(&[4; 32]).expect("key");
    let hosts = fleet(&["n1"]);
    let names = Names::new(&hosts);
    let held = summary_of_states(
        "n1",
        1_700_000_000_000,
        &[(GpuState::Clean, 0b01), (GpuState::Leak, 0b10)],
        &[("residual", "leak", 1)],
    );
    let at = 1_700_000_001.0;
    let read = |body: &bytes::Bytes, k: Option<&gpusweep_core::seal::SealKey>| {
        proofs(&p, &names, body, k).expect("an answer").remove(0)
    };
    // The serve's own page: proven, and it reads back as it was judged.
    let honest = sealed_answer(&key, &held, at, |_| {});
    assert_eq!(read(&honest, Some(&key)), Proof::Proven(held.clone()));
    // Without the key, or under another, nothing is proven.
    assert_eq!(read(&honest, None), Proof::None);
    assert!(matches!(read(&honest, Some(&other)), Proof::Broken(_)));
    let broken = |body: &bytes::Bytes| match read(body, Some(&key)) {
        Proof::Broken(why) => why,
        x => panic!("not broken: {x:?}"),
    };
    // An impostor's "clean" for GPU 1 (a Pushgateway's series under the serve's labels): the seal fails.
    let forged = sealed_answer(&key, &held, at, |page| {
        for l in page.iter_mut() {
            *l = l.replace(
                r#""state":"clean"},"value":[1700000001,"1""#,
                r#""state":"clean"},"value":[1700000001,"3""#,
            );
        }
        page.retain(|l| !l.contains(r#""state":"leak""#));
        page.retain(|l| !l.contains("finding_kinds"));
    });
    assert!(
        broken(&forged).contains("does not check"),
        "{}",
        broken(&forged)
    );
    // Two answers for one part (the impostor at another instance): a conflict.
    let twice = sealed_answer(&key, &held, at, |page| {
        let copy = page[4].replace("n1:9401", "pushgateway:9091");
        page.push(copy);
    });
    assert!(broken(&twice).contains("2 answers"), "{}", broken(&twice));
    // A summary without its seal, or truncated.
    let unsealed = sealed_answer(&key, &held, at, |page| {
        page.retain(|l| !l.contains("mac_1"));
    });
    assert!(
        broken(&unsealed).contains("no seal"),
        "{}",
        broken(&unsealed)
    );
    // A page that once was true, replayed two minutes later.
    let replayed = sealed_answer(&key, &held, at + 120.0, |_| {});
    assert!(
        broken(&replayed).contains("replay"),
        "{}",
        broken(&replayed)
    );
    // An older genuine page after a newer one (pushed back under the serve's labels): a replay.
    let mut newest = 0;
    let now = Proof::Proven(held.clone()).not_older_than("n1", &mut newest);
    assert_eq!(newest, held.taken_ms);
    assert!(matches!(now, Proof::Proven(_)));
    let mut older = held.clone();
    older.taken_ms -= 1_000;
    assert!(matches!(
        Proof::Proven(older).not_older_than("n1", &mut newest),
        Proof::Broken(why) if why.contains("replay")
    ));
    // Reordered series say the same.
    let reordered = sealed_answer(&key, &held, at, |page| page.reverse());
    assert_eq!(read(&reordered, Some(&key)), Proof::Proven(held.clone()));
    // Another host's sealed page under this host's name.
    let mut theirs = held.clone();
    theirs.host = "n2".into();
    let moved = sealed_answer(&key, &theirs, at, |page| {
        for l in page.iter_mut() {
            *l = l.replace(r#""Hostname":"n2""#, r#""Hostname":"n1""#);
        }
    });
    assert!(matches!(read(&moved, Some(&key)), Proof::Broken(_)));
}
