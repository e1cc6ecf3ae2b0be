//! A bounded power-of-two ring with wrapping indices (as `rxe_queue.h` and vm-virtio's queues):
//! the producer and consumer counters run free and are masked on use, so `tail - head` is the
//! fill level even across wrap.

use std::num::Wrapping;

/// A bounded FIFO of `T` whose slots are addressed by free-running absolute indices.
#[derive(Debug)]
pub struct Ring<T> {
    slots: Box<[Option<T>]>,
    mask: u32,
    head: Wrapping<u32>,
    tail: Wrapping<u32>,
}

impl<T> Ring<T> {
    /// A ring of at least `depth` slots, rounded up to a power of two (`depth` ≥ 1).
    pub fn new(depth: u32) -> Ring<T> {
        let cap = depth.max(1).next_power_of_two();
        Ring {
            slots: (0..cap).map(|_| None).collect(),
            mask: cap - 1,
            head: Wrapping(0),
            tail: Wrapping(0),
        }
    }

    #[allow(dead_code)]
    pub fn capacity(&self) -> u32 {
        self.mask + 1
    }

    pub fn len(&self) -> u32 {
        (self.tail - self.head).0
    }

    pub fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    pub fn is_full(&self) -> bool {
        self.len() > self.mask
    }

    /// Absolute index of the oldest element.
    pub fn head(&self) -> u32 {
        self.head.0
    }

    /// Absolute index the next pushed element gets.
    pub fn tail(&self) -> u32 {
        self.tail.0
    }

    /// Appends; gives the value back when the ring is full.
    pub fn push(&mut self, value: T) -> Result<u32, T> {
        if self.is_full() {
            return Err(value);
        }
        let at = self.tail.0;
        self.slots[(at & self.mask) as usize] = Some(value);
        self.tail += 1;
        Ok(at)
    }

    pub fn pop(&mut self) -> Option<T> {
        if self.is_empty() {
            return None;
        }
        let v = self.slots[(self.head.0 & self.mask) as usize].take();
        self.head += 1;
        v
    }

    /// True if `index` lies in `head..tail` (wrapping).
    pub fn contains(&self, index: u32) -> bool {
        (Wrapping(index) - self.head).0 < self.len()
    }

    pub fn get(&self, index: u32) -> Option<&T> {
        if !self.contains(index) {
            return None;
        }
        self.slots[(index & self.mask) as usize].as_ref()
    }

    pub fn get_mut(&mut self, index: u32) -> Option<&mut T> {
        if !self.contains(index) {
            return None;
        }
        self.slots[(index & self.mask) as usize].as_mut()
    }

    pub fn front(&self) -> Option<&T> {
        self.get(self.head.0)
    }

    pub fn front_mut(&mut self) -> Option<&mut T> {
        self.get_mut(self.head.0)
    }

    /// Drains every element, oldest first.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        std::iter::from_fn(move || self.pop())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_bounds() {
        let mut r = Ring::new(3);
        assert_eq!(r.capacity(), 4);
        r.head = Wrapping(u32::MAX - 1);
        r.tail = r.head;
        for i in 0..4 {
            r.push(i).unwrap();
        }
        assert_eq!(r.push(9), Err(9));
        assert_eq!(r.len(), 4);
        assert_eq!(r.get(u32::MAX), Some(&1));
        assert_eq!(r.get(1), Some(&3));
        assert_eq!(r.get(2), None);
        assert_eq!(r.pop(), Some(0));
        assert_eq!(r.drain().collect::<Vec<_>>(), vec![1, 2, 3]);
        assert!(r.is_empty());
    }
}
