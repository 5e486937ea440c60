//! The engine the end-to-end tests run against is there, and so is their image.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use bollard::query_parameters::ListContainersOptionsBuilder;
use hermes_tests::{engine, test_image};

#[tokio::test]
async fn engine_answers_and_lists_containers_and_has_the_test_image() {
    let docker = engine().await;

    let filters = HashMap::from([("label", vec!["hermes-agent=1"])]);
    let options = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    let containers = docker
        .list_containers(Some(options))
        .await
        .expect("the engine lists containers");
    for container in &containers {
        let labels = container.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("hermes-agent").map(String::as_str),
            Some("1"),
            "the label filter was applied: {container:?}"
        );
    }

    let image = test_image();
    let inspected = docker.inspect_image(&image).await.unwrap_or_else(|error| {
        panic!("the test image {image} is not in the engine ({error}); run scripts/test, which builds it")
    });
    assert!(
        inspected.repo_tags.unwrap_or_default().contains(&image),
        "the image inspected as {image} carries that tag"
    );
    assert_eq!(inspected.os.as_deref(), Some("linux"));
}
