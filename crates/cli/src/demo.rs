pub async fn run() -> anyhow::Result<u8> { anyhow::bail!("demo not built yet") }
